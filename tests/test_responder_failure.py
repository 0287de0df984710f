"""A responder that fails: the total deadline of a request, the contract check at start, and the run that stops on
unscorable rounds (with a checkpoint to resume from) instead of training on zeros."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from fake_openai_server import FaultyOpenAIServer
from reward_columns import columns

from memstate.errors import ConfigError, ResponderFailure
from memstate.http import HTTPClient, HTTPSettings, HTTPUnavailable
from memstate.leak import instance_leak_reason
from memstate.prompts import responder_messages
from memstate.responders import ResponderConfig, make_responder
from memstate.responders.remote import OpenAIResponder, ResponderIncompatible
from memstate.reward.counterfactual import CounterfactualGainReward, RewardConfig
from memstate.reward.failure import UnscorableGuard
from memstate.reward.responder_score import score_mode

ROOT = Path(__file__).resolve().parents[1]
STATE = "- Weigh the evidence against the user's view.\n- Answer from the evidence facts only."


# ---- deadline ---------------------------------------------------------------------------------------------------


def test_a_request_gives_up_at_its_deadline_not_after_every_timeout(fever_train):
    messages = [responder_messages(fever_train[0])]
    with FaultyOpenAIServer(stall=1.0, stall_s=4.0) as server:  # every request hangs
        # Without the deadline: 4 attempts x 2 s timeout (+ waits) = 8 s or more.
        responder = OpenAIResponder(server.url, "fake-responder", timeout=2.0, max_retries=3, backoff=0.01,
                                    deadline=0.6)  # fmt: skip
        start = time.monotonic()
        assert responder.answer(messages) == [None]
        took = time.monotonic() - start
        responder.close()
        assert 0.5 < took < 1.5, took
        assert "deadline" in responder.last_error and "/v1/chat/completions" in responder.last_error

        with HTTPClient(HTTPSettings(server.url, timeout=2.0, max_retries=3, backoff=0.01, deadline=0.6)) as client:
            start = time.monotonic()
            with pytest.raises(HTTPUnavailable, match=r"within the 0\.6 s deadline") as gave_up:
                client.request("GET", "/v1/models")
            assert time.monotonic() - start < 1.5 and gave_up.value.kind == "deadline"


def test_a_retry_that_would_start_after_the_deadline_is_not_waited_for():
    with FaultyOpenAIServer(fail=1.0) as server:  # 500 at once; the first wait is a draw from [0, 100 s]
        settings = HTTPSettings(server.url, max_retries=3, backoff=100.0, max_delay=100.0, deadline=2.0)
        with HTTPClient(settings, seed=0) as client:
            start = time.monotonic()
            with pytest.raises(HTTPUnavailable, match="would start after the 2 s deadline") as gave_up:
                client.request("GET", "/v1/models")
            assert time.monotonic() - start < 1.0
    assert (gave_up.value.kind, gave_up.value.attempts, server.counts["requests"]) == ("deadline", 1, 1)
    assert "attempt 1: HTTP 500" in str(gave_up.value)


def test_the_deadline_is_a_responder_setting():
    assert ResponderConfig().responder_deadline == 600.0
    with pytest.raises(ConfigError, match="responder_deadline must be positive"):
        ResponderConfig(responder_deadline=0)
    with FaultyOpenAIServer() as server:
        config = ResponderConfig(responder_model="fake-responder", responder_url=server.url, responder_deadline=7.5)
        responder = make_responder(config)
        assert responder.settings.deadline == 7.5 and responder.max_model_len == 4096
        assert responder.server_version == "0.31.0"
        responder.close()


# ---- contract at start ------------------------------------------------------------------------------------------


def config_for(url: str, mode: str = "likelihood") -> ResponderConfig:
    return ResponderConfig(responder_model="fake-responder", responder_url=url, score_mode=mode,
                           responder_max_retries=0)  # fmt: skip


def scoring_responder(config: ResponderConfig, *, answer_flow: bool = False):
    """As the commands that score make it: the log-prob requests checked when the mode (or answer flow) needs them."""
    return make_responder(config, likelihood=score_mode(config.score_mode).likelihood or answer_flow)


def test_the_contract_check_names_what_the_server_lacks_and_its_version():
    with FaultyOpenAIServer(lacks=("logprob_token_ids",), version="0.19.1", max_model_len=None) as server:
        with pytest.raises(ResponderIncompatible) as refused:
            scoring_responder(config_for(server.url))
        message = str(refused.value)
        assert "server version 0.19.1" in message and "logprob_token_ids" in message
        assert "choices[0].logprobs.content[0].top_logprobs" in message and "score_mode: exact" in message
        assert "\n" not in message
        # Exact mode sends no likelihood request: the same server will do (and reports no max_model_len).
        responder = scoring_responder(config_for(server.url, "exact"))
        assert responder.max_model_len is None and responder.server_version == "0.19.1"
        responder.close()
        # ... nor does a command that only asks for answers (memory ask, eval memsyco), whatever score_mode says ...
        make_responder(config_for(server.url)).close()
        # ... unless the answer-flow check needs likelihood scores.
        with pytest.raises(ResponderIncompatible, match="logprob_token_ids"):
            scoring_responder(config_for(server.url, "exact"), answer_flow=True)

    with FaultyOpenAIServer(lacks=("prompt_logprobs",), version=None) as server:
        with pytest.raises(ResponderIncompatible, match=r"version unknown.*prompt_logprobs"):
            scoring_responder(config_for(server.url))


def test_training_against_a_responder_without_logprob_token_ids_stops_before_the_policy_loads(
    tiny_models, fever_data, tmp_path, capsys
):
    from memstate.cli import main

    out = tmp_path / "run"
    with FaultyOpenAIServer(lacks=("logprob_token_ids",), version="0.30.2") as server:
        start = time.monotonic()
        code = main(["train", "--config", "configs/train/tiny_cpu.yaml", "--policy_model", str(tiny_models["policy"]),
                     "--data_dir", str(fever_data), "--responder_url", server.url, "--responder_model",
                     "fake-responder", "--output_dir", str(out)])  # fmt: skip
        took = time.monotonic() - start
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and err.startswith("memstate train: error: responder at ")
    assert "server version 0.30.2" in err and "logprob_token_ids" in err and "likelihood scoring needs them" in err
    assert not out.exists() and took < 30  # nothing loaded, nothing written


# ---- the guard --------------------------------------------------------------------------------------------------


def test_guard_threshold_patience_and_reduce():
    guard = UnscorableGuard(max_share=0.5, patience=3)
    assert guard.observe(8, 4) == 0.5  # at the threshold is not above it
    guard.observe(8, 5)
    guard.observe(0, 0)  # nothing needed the responder: neither counts nor resets
    guard.observe(8, 8)
    with pytest.raises(ResponderFailure, match=r"8 of 8 .* in 3 consecutive generation rounds; last error: boom"):
        guard.observe(8, 8, "boom")
    assert guard.streak == 3 and guard.rounds == 5

    guard = UnscorableGuard(max_share=0.5, patience=2)
    guard.observe(8, 8)
    guard.observe(8, 0)  # a good round resets the streak
    guard.observe(8, 8)  # 1 of 2 again

    # Every rank sums the same totals: this rank's 4 of 4 are 4 of 12 over all ranks, below the threshold ...
    calls = []
    guard = UnscorableGuard(max_share=0.5, patience=1, reduce=lambda v: calls.append(v) or [v[0] + 8, v[1] + 0])
    assert guard.observe(4, 4) == pytest.approx(1 / 3) and calls == [[4, 4]]
    # ... and a rank with nothing to score still takes part and stops with the others.
    with pytest.raises(ResponderFailure, match="8 of 8"):
        UnscorableGuard(reduce=lambda v: [v[0] + 8, v[1] + 8]).observe(0, 0)

    never = UnscorableGuard(max_share=1.0)
    assert all(never.observe(8, 8) == 1.0 for _ in range(5))
    with pytest.raises(ConfigError):
        UnscorableGuard(patience=0)


def test_the_reward_stops_before_its_round_trains_and_says_why(fever_train):
    instances = [i for i in fever_train[:4] for _ in range(2)]
    completions = [STATE] * len(instances)
    with FaultyOpenAIServer(fail=1.0) as server:
        responder = OpenAIResponder(server.url, "fake-responder", max_retries=0)
        without = CounterfactualGainReward(responder, RewardConfig())
        assert without(prompts=[None] * len(instances), completions=completions, **columns(instances)) == [None] * 8
        reward = CounterfactualGainReward(responder, RewardConfig(), guard=UnscorableGuard(0.5, 1))
        with pytest.raises(ResponderFailure, match=r"8 of 8 completions .* last error: POST .*HTTP 500") as stop:
            reward(prompts=[None] * len(instances), completions=completions, **columns(instances))
        responder.close()
    assert stop.value.share == 1.0 and "injected failure" in stop.value.last_error


def test_a_hung_responder_costs_one_round_budget_and_the_round_is_unscorable(fever_train):
    """A server that accepts connections and never answers: each request alone would wait its 30 s deadline, pass
    after pass; the round's budget (2 s) ends them all, the later passes are not started, and the answer-flow
    failures count as unscorable, so the guard stops the run."""
    instances = [i for i in fever_train[:4] for _ in range(2)]
    completions = [STATE] * len(instances)
    with FaultyOpenAIServer() as server:
        responder = OpenAIResponder(server.url, "fake-responder", timeout=30.0, max_retries=2, deadline=30.0)
        responder.check_health()
        server.stall, server.stall_s = 1.0, 120.0  # from now on: connections accepted, no reply
        config = RewardConfig(answer_flow_check=True, round_deadline=2.0)
        metrics: dict[str, float] = {}
        reward = CounterfactualGainReward(responder, config, guard=UnscorableGuard(0.5, 1))
        instance_leak_reason(STATE, instances[0])  # the word rules' first use compiles them: not the responder's time
        start = time.monotonic()
        with pytest.raises(ResponderFailure, match=r"8 of 8 completions .*unscorable") as stop:
            reward(prompts=[None] * 8, completions=completions, log_metric=metrics.__setitem__, **columns(instances))
        took = time.monotonic() - start
        responder.close()
    assert took < 6, (
        took,
        {k: v for k, v in metrics.items() if "time" in k},
    )  # one budget, not 30 s per request and pass
    assert "2 s round deadline" in stop.value.last_error, stop.value.last_error
    assert metrics["memstate/round_failed"] == 1.0 and metrics["memstate/answer_flow_unscorable"] == 8
    assert server.counts["requests"] <= 10, server.counts  # the no-memory pass only: the later passes never started


# ---- a responder that dies mid-run ------------------------------------------------------------------------------


def train_argv(tiny_models, fever_data, out: Path, url: str) -> list[str]:
    return [
        sys.executable, "-m", "memstate.cli", "train", "--config", "configs/train/tiny_cpu.yaml",
        "--policy_model", str(tiny_models["policy"]), "--data_dir", str(fever_data), "--output_dir", str(out),
        "--responder_url", url, "--responder_model", "fake-responder",
        "--responder_timeout", "2", "--responder_max_retries", "1", "--responder_deadline", "5",
        "--max_steps", "4", "--save_steps", "1", "--logging_steps", "1", "--report_to", "none",
        "--eval_strategy", "no",  # the failure under test is the training round's
        # 20 warm-up steps at T = 0.7 are enough for most states to pass the format gate, so a round needs the
        # responder (a state that fails a gate is scored without it).
        "--format_warmup_steps", "20", "--format_warmup_lr_scheduler_type", "constant", "--temperature", "0.7",
        "--shared_prefix_check", "off",
    ]  # fmt: skip


def fail_after_first_step(argv, server, out: Path, logs: tuple[Path, Path], env, fault) -> tuple[int, float]:
    """Train (``argv``) against ``server`` until checkpoint-1 is saved, then ``fault()`` the server; the run's exit
    code and the seconds from the fault to its end."""
    argv[argv.index("--responder_url") + 1] = server.url
    with open(logs[0], "w") as stdout, open(logs[1], "w") as stderr:
        proc = subprocess.Popen(argv, stdout=stdout, stderr=stderr, cwd=ROOT, env=env)
        try:
            give_up = time.monotonic() + 300
            while not (out / "checkpoint-1" / "trainer_state.json").is_file():  # one optimizer step done
                assert proc.poll() is None, f"training ended early:\n{logs[1].read_text()[-3000:]}"
                assert time.monotonic() < give_up, "no checkpoint-1 after 300 s"
                time.sleep(0.1)
            fault()
            start = time.monotonic()
            code = proc.wait(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
    return code, time.monotonic() - start


def unscorable_share(audit_file: Path) -> float:
    rows = pd.read_parquet(audit_file)
    scored = rows[rows["gate"] == "ok"]
    return float(scored["reward"].isna().mean()) if len(scored) else 0.0


def test_a_responder_that_dies_mid_run_stops_training_with_a_checkpoint_and_resume_finishes(
    tiny_models, fever_data, tmp_path
):
    out = tmp_path / "run"
    argv = train_argv(tiny_models, fever_data, out, "http://127.0.0.1:1")  # the URL is set below
    logs = tmp_path / "first.out", tmp_path / "first.err"
    env = os.environ | {"WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    with FaultyOpenAIServer() as server:
        code, stopped_within = fail_after_first_step(argv, server, out, logs, env, server.stop)
    err = logs[1].read_text()
    last = err.strip().splitlines()[-1]
    assert code == 3, err[-3000:]
    assert stopped_within < 60  # responder_deadline 5 s: the first round after the server died stops the run
    assert last.startswith("memstate train: error: training stopped before optimizer step "), last
    assert "unscorable" in last and "ConnectError" in last and "fix the responder and rerun with --resume" in last

    stopped = json.loads((out / "stopped.json").read_text())
    step = stopped["step"]
    checkpoint = out / f"checkpoint-{step}"
    assert step >= 1 and stopped["reason"].startswith("responder failure: ") and stopped["unscorable_share"] > 0.5
    assert stopped["checkpoint"] == str(checkpoint) and f"checkpoint-{step} (step {step})" in last
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["global_step"] == step and max(e["step"] for e in state["log_history"]) == step
    assert (checkpoint / "memstate.json").is_file() and (checkpoint / "optimizer.pt").is_file()
    assert not (out / f"checkpoint-{step + 1}").exists() and not (out / "final").exists()
    # No optimizer step trained on a round the responder failed: every completed step's round was scored (up to the
    # allowed share); the round after them, the first after the server died, was not, and stopped the run.
    audit = {int(p.name[5:11]): p for p in (out / "audit").glob("step-*-rank0.parquet")}
    assert max(audit) == step + 1, sorted(audit)
    assert all(unscorable_share(audit[s]) <= 0.5 for s in range(1, step + 1))
    assert unscorable_share(audit[step + 1]) > 0.5

    # The responder is back on the same URL: --resume continues from that checkpoint to the end.
    with FaultyOpenAIServer(port=server.port) as server:
        done = subprocess.run([*argv, "--resume"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "final" / "memstate.json").is_file() and server.counts["ok"] > 0
    history = json.loads((out / "log_history.json").read_text())
    steps = sorted({e["step"] for e in history if "reward" in e})
    assert steps == [1, 2, 3, 4]
    assert [e for e in history if e["step"] <= step] == state["log_history"]  # continued, not restarted
    assert json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())["global_step"] == 4


def test_a_hung_responder_mid_run_stops_training_within_one_round_budget(tiny_models, fever_data, tmp_path):
    """A responder that keeps accepting connections and never answers: each request alone would wait its 60 s
    deadline, pass after pass; responder_round_deadline (3 s) bounds the round, which is unscorable, and the run
    stops with a checkpoint, stopped.json naming the cause, and exit 3."""
    out = tmp_path / "run"
    argv = train_argv(tiny_models, fever_data, out, "http://127.0.0.1:1")
    argv[argv.index("--responder_timeout") + 1] = "60"
    argv[argv.index("--responder_deadline") + 1] = "60"
    argv += ["--responder_round_deadline", "3"]
    err_log = tmp_path / "err"
    env = os.environ | {"WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}

    def hang() -> None:  # connections accepted, no reply
        server.stall, server.stall_s = 1.0, 600.0

    with FaultyOpenAIServer() as server:
        code, stopped_within = fail_after_first_step(argv, server, out, (tmp_path / "out", err_log), env, hang)
    err = err_log.read_text()
    assert code == 3, err[-3000:]
    assert stopped_within < 45, stopped_within  # per-request deadlines alone: 60 s for each pass, 120 s or more
    stopped = json.loads((out / "stopped.json").read_text())
    assert stopped["reason"].startswith("responder failure: ") and "3 s round deadline" in stopped["reason"], stopped
    assert (out / f"checkpoint-{stopped['step']}" / "trainer_state.json").is_file()
