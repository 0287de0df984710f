"""The HTTP responder against a real local server that fails, stalls and garbles requests."""

import json
import math

import pytest
from fake_openai_server import FaultyOpenAIServer
from reward_columns import columns

from memstate.prompts import responder_messages
from memstate.responders.remote import OpenAIResponder, ResponderUnavailable
from memstate.reward.counterfactual import CounterfactualGainReward, RewardConfig

STATE = "- Weigh the evidence against the user's view.\n- Answer from the evidence facts only."


def client(url: str, **kw) -> OpenAIResponder:
    return OpenAIResponder(url, "fake-responder", **{"timeout": 2.0, "max_retries": 2, "backoff": 0.01} | kw)


def test_clean_server_agrees_with_the_synthetic_logprobs(fever_train):
    with FaultyOpenAIServer() as server:
        responder = client(server.url)
        responder.check_health()
        [[a, b]] = responder.answer_logprob([responder_messages(fever_train[0])], [["A", "BC"]])
        assert a.n_tokens == 1 and a.logprob == pytest.approx(-0.1 * (1 + ord("A") % 7))
        assert b.n_tokens == 2 and b.logprob == pytest.approx(-0.1 * (2 + ord("B") % 7 + ord("C") % 7))
        assert responder.answer([responder_messages(fever_train[0])]) == ["A"]
        # single-token candidates go through one chat request with logprob_token_ids
        before = server.counts["requests"]
        [[a2, c2]] = responder.answer_logprob([responder_messages(fever_train[1])], [["A", "C"]])
        assert (a2.logprob, c2.logprob) == (pytest.approx(a.logprob), pytest.approx(-0.1 * (1 + ord("C") % 7)))
        assert server.counts["requests"] - before == 2  # /tokenize of the new "C", then one chat request
        responder.close()


@pytest.mark.parametrize("mode", ["likelihood", "exact"])
def test_faults_never_escape_and_counters_match_the_server(fever_train, mode):
    instances = [i for i in fever_train[:24] for _ in range(2)]  # 2 candidates each
    completions = [STATE if n % 2 else STATE + "\n- Check F1 twice." for n in range(len(instances))]
    with FaultyOpenAIServer(fail=0.2, stall=0.03, garbage=0.05, stall_s=2.5, seed=1) as server:
        responder = client(server.url, concurrency=8)
        reward = CounterfactualGainReward(responder, RewardConfig(mode=mode))
        metrics = {}
        out = reward(prompts=[None] * len(instances), completions=completions, log_metric=metrics.__setitem__,
                     **columns(instances))  # fmt: skip
        responder.close()
    assert len(out) == len(instances)
    assert all(r is None or (isinstance(r, float) and math.isfinite(r) and -1.0 <= r <= 1.0) for r in out)
    stats, counts = responder.stats, server.counts
    assert counts["failed"] > 0 and counts["stalled"] > 0 and counts["garbage"] > 0
    assert stats.requests == counts["requests"]
    assert stats.server_errors == counts["failed"]
    assert stats.timeouts == counts["stalled"]
    assert stats.bad_replies == counts["garbage"]
    assert sum(r is None for r in out) == metrics["memstate/unscorable"] == reward.unscorable


def test_retry_budget_exhaustion_gives_none_not_an_exception(fever_train):
    with FaultyOpenAIServer(fail=1.0) as server:
        responder = client(server.url, max_retries=2)
        assert responder.answer([responder_messages(fever_train[0])]) == [None]
        assert server.counts["requests"] == 3 and responder.stats.gave_up == 1
        assert responder.stats.unscorable_prompts == 1
        responder.close()


def test_a_responder_that_is_down_is_a_clear_error_at_start():
    import socket

    with socket.socket() as s:  # a port on which nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    responder = client(f"http://127.0.0.1:{port}")
    with pytest.raises(ResponderUnavailable, match=f"127.0.0.1:{port} is unreachable"):
        responder.check_health()
    responder.close()


def test_wrong_model_name_is_a_clear_error():
    with FaultyOpenAIServer() as server:
        responder = OpenAIResponder(server.url, "other-model")
        with pytest.raises(ResponderUnavailable, match=r"serves \['fake-responder'\], not 'other-model'"):
            responder.check_health()
        responder.close()


def test_training_with_a_down_responder_fails_before_training(tiny_models, fever_data, tmp_path, capsys):
    import socket

    from memstate.cli import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [
        "train", "--config", "configs/train/tiny_cpu.yaml",
        "--policy_model", str(tiny_models["policy"]), "--responder_model", "tiny-responder",
        "--responder_url", f"http://127.0.0.1:{port}", "--responder_max_retries", "0",
        "--data_dir", str(fever_data), "--output_dir", str(tmp_path / "run"),
    ]  # fmt: skip
    try:  # the CLI prints a MemstateError in one line and exits 2 (it raises under --debug)
        code, message = main(args), capsys.readouterr().err
    except ResponderUnavailable as e:
        code, message = 2, str(e)
    assert code == 2 and f"127.0.0.1:{port}" in message and "unreachable" in message
    assert not (tmp_path / "run" / "format-warmup").exists()  # nothing was trained


def test_the_http_responder_does_not_import_torch():
    """No import cycle with memstate.responders.local (torch, transformers): the protocol lives in a light module, and
    the package re-exports only light names."""
    import subprocess
    import sys

    code = "import sys, memstate.responders.remote; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_precompute_baselines_sends_the_api_key_a_server_requires(fever_data, tmp_path, monkeypatch, capsys):
    from memstate.cli import main

    monkeypatch.setenv("MEMSTATE_TEST_RESPONDER_KEY", "s3cret")
    with FaultyOpenAIServer(api_key="s3cret") as server:
        argv = ["reward", "precompute-baselines", "--data", str(fever_data), "--split", "test", "--responder-model",
                "fake-responder", "--responder-url", server.url, "--responder-max-retries", "0"]  # fmt: skip
        assert main([*argv, "--cache", str(tmp_path / "no-key.sqlite")]) != 0  # refused: 401, named
        assert "401" in capsys.readouterr().err
        key = ["--responder-api-key-env", "MEMSTATE_TEST_RESPONDER_KEY", "--cache", str(tmp_path / "key.sqlite")]
        assert main([*argv, *key]) == 0
        counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert counts["scored"] == counts["instances"] > 0 and server.counts["ok"] > 0
