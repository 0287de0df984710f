"""Score modes are a registry (``memstate.reward.responder_score``): a mode built on the responder's existing calls is
one ``register_score_mode(ScoreMode(...))``, here from this test module, and every stage that scores takes it with no
other edit; an unknown one is refused naming the registered ones. The built-ins' cache keys are pinned: a changed key
would silently invalidate every baseline cache users have filled."""

from __future__ import annotations

import json

import pytest
from fake_openai_server import FaultyOpenAIServer
from reward_columns import columns

from memstate.cli import main
from memstate.errors import ConfigError
from memstate.prompts import responder_messages
from memstate.responders import ResponderConfig, make_responder
from memstate.responders.remote import ResponderIncompatible
from memstate.reward.cache import BaselineCache, baseline_key
from memstate.reward.counterfactual import CounterfactualGainReward, RewardConfig
from memstate.reward.responder_score import (
    Judgement,
    ResponderRequest,
    ScoreMode,
    continuation_logprobs,
    judge,
    register_score_mode,
    responder_request,
    score_mode,
    score_mode_names,
    unregister_score_mode,
)
from memstate.rules import parse_state
from memstate.schema import Fact, Instance, option_letters

TOP1 = "likelihood-top1"


# ---- a toy mode, defined here and nowhere else --------------------------------------------------------------------


def top1_request(instance: Instance, rules: tuple[str, ...] | None) -> ResponderRequest:
    return ResponderRequest.of(TOP1, instance, rules, continuations=option_letters(len(instance.candidates)))


def top1_judgements(responder, instances: list[Instance], requests: list[ResponderRequest]) -> list[Judgement | None]:
    """1.0 when the right option is the responder's most likely one, else 0.0 (closed sets only)."""
    judged: list[Judgement | None] = []
    for request, logprobs in zip(requests, continuation_logprobs(responder, requests), strict=True):
        if logprobs is None:
            judged.append(None)
            continue
        values = [lp.logprob for lp in logprobs]
        best = request.continuations[values.index(max(values))]
        judged.append(Judgement(float(best == request.reference), best == request.reference, best))
    return judged


@pytest.fixture(scope="module")
def top1():
    mode = register_score_mode(ScoreMode(TOP1, "1 when the right option is the most likely", top1_request,
                                         top1_judgements, likelihood=True))  # fmt: skip
    yield mode
    unregister_score_mode(TOP1)


def good_state(inst):
    user = next(f.id for f in inst.facts if f.kind != "evidence")
    ev = next(f.id for f in inst.facts if f.kind == "evidence")
    return f"- Weigh the evidence in {ev} against the user's claim in {user}.\n- Answer from the evidence facts only."


def test_a_registered_mode_scores_through_judge_and_the_reward(top1, responder, fever_train):
    insts = fever_train[3:7]
    states = [good_state(i) for i in insts]
    rules = [parse_state(s).rules for s in states]
    base, ours = judge(responder, insts, [None] * 4, TOP1), judge(responder, insts, rules, TOP1)
    # The toy's score is the likelihood mode's "correct": the argmax letter is the right one.
    likely = judge(responder, insts, [None] * 4, "likelihood")
    assert [b.score for b in base] == [float(j.correct) for j in likely]
    assert [b.answer for b in base] == [j.answer for j in likely]

    reward = CounterfactualGainReward(responder, RewardConfig(mode=TOP1, answer_flow_check=False), BaselineCache())
    out = reward(prompts=[None] * 4, completions=states, **columns(insts))
    assert out == [o.score - b.score for o, b in zip(ours, base, strict=True)]
    assert set(out) <= {-1.0, 0.0, 1.0}
    # Its baselines are cached under its own key: the same continuations, another mode.
    key, other = baseline_key(insts[0], TOP1, responder.identity), baseline_key(insts[0], "likelihood", "x")
    assert reward.cache.get_many([key]) and key.digest != other.digest
    assert responder_request(insts[0], None, TOP1).key()["continuations"] == ["A", "B", "C"]


def test_a_registered_mode_runs_through_the_cli(top1, tiny_models, fever_data, tmp_path, capsys):
    cache = tmp_path / "baselines.sqlite"
    argv = ["reward", "precompute-baselines", "--data", str(fever_data), "--split", "test", "--responder",
            str(tiny_models["responder"]), "--cache", str(cache), "--score_mode", TOP1]  # fmt: skip
    code = main(["--log-level", "ERROR", *argv])
    assert code == 0
    counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert counts["unscorable"] == 0 and counts["scored"] == counts["instances"] > 0


def test_a_likelihood_mode_has_the_server_checked_for_log_probs(top1):
    with FaultyOpenAIServer(lacks=("logprob_token_ids",)) as server:
        config = ResponderConfig(responder_model="fake-responder", responder_url=server.url, score_mode=TOP1,
                                 responder_max_retries=0)  # fmt: skip
        with pytest.raises(ResponderIncompatible, match="logprob_token_ids"):
            make_responder(config, likelihood=score_mode(config.score_mode).likelihood)


def test_registry_lookup_and_unknown_modes(top1):
    assert score_mode_names()[:2] == ("likelihood", "exact") and TOP1 in score_mode_names()
    assert score_mode("likelihood").likelihood and not score_mode("exact").likelihood
    assert score_mode(TOP1) is top1
    with pytest.raises(ConfigError, match=f"unknown score_mode 'exakt'; known: likelihood, exact, {TOP1}$"):
        score_mode("exakt")
    for refused in (lambda: RewardConfig(mode="exakt"), lambda: responder_request(None, None, "exakt")):
        with pytest.raises(ConfigError, match="known: likelihood, exact"):
            refused()
    register_score_mode(top1)  # the same mode again (a module imported twice): fine
    with pytest.raises(ValueError, match="already registered"):
        register_score_mode(ScoreMode("exact", "another", top1_request, top1_judgements, likelihood=True))


def test_a_mode_in_its_own_module_is_found_by_its_name(tmp_path, monkeypatch):
    """``memstate.reward.score_mode_<name>`` registers itself when the first lookup imports it; no list names it."""
    import sys

    import memstate.reward
    from memstate.reward import responder_score

    (tmp_path / "score_mode_toy.py").write_text(
        "from memstate.reward.responder_score import ScoreMode, exact_judgements, exact_request, register_score_mode\n"
        "register_score_mode(ScoreMode('toy', 'exact, renamed', exact_request, exact_judgements, likelihood=False))\n"
    )
    monkeypatch.setattr(memstate.reward, "__path__", [*memstate.reward.__path__, str(tmp_path)])
    monkeypatch.setattr(responder_score.SCORE_MODES, "loaded", False)
    monkeypatch.delitem(sys.modules, "memstate.reward.score_mode_toy", raising=False)
    try:
        assert score_mode("toy").summary == "exact, renamed" and "toy" in score_mode_names()
    finally:
        unregister_score_mode("toy")
        sys.modules.pop("memstate.reward.score_mode_toy", None)


# ---- the built-ins' cache keys, as they were before the registry --------------------------------------------------

FACTS = (Fact(id="u1", text="The user says the bridge opened in 1990.", kind="belief"),
         Fact(id="e1", text="Records show the bridge opened in 1987.", kind="evidence"))  # fmt: skip
CLOSED = Instance(id="pin-closed", source="toy", task="evidence_conflict", perspective="belief",
                  question="Did the bridge open in 1990?", options=(), answer="refuted", answer_kind="label",
                  labels=("supported", "refuted", "not enough info"), facts=FACTS, relations=())  # fmt: skip
FREE = Instance(id="pin-free", source="toy", task="fact_recall", perspective="none",
                question="When did the bridge open?", options=(), answer="in 1987", answer_kind="free", labels=(),
                facts=FACTS, relations=())  # fmt: skip
DECODING = {"greedy": True, "max_new_tokens": 16}


@pytest.mark.parametrize(
    ("inst", "mode", "fields", "digest"),
    [
        (CLOSED, "likelihood", {"reference": "B", "continuations": ["A", "B", "C"]},
         "e960f2ff32033b7e01d19762d5de76249e75c27e3d5b61f9017d60286182f827"),
        (CLOSED, "exact", {"reference": "B", "decoding": DECODING},
         "095653ab25300aa9cdd6a612114d361d61d435e0325140c0270d5799b09413e5"),
        (FREE, "likelihood", {"reference": "in 1987", "continuations": ["in 1987"]},
         "14be643857042acd59d84633af316c3d26b0d6481dcf09a660d3fddcf881da93"),
        (FREE, "exact", {"reference": "in 1987", "decoding": DECODING},
         "07ece797d16cfd5a7d6a66210ce21887df9ca23d1afac5b4d1aaf8990c12cff5"),
    ],
)  # fmt: skip
def test_the_built_in_modes_keep_their_cache_keys(inst, mode, fields, digest):
    """The keys (and their baseline-cache digests) computed by the code before score modes were a registry. The digest
    covers the prompt too: a deliberate prompt change (with a new PROMPT_VERSION) changes it, and this pin with it."""
    key = responder_request(inst, None, mode).key()
    assert key == {"mode": mode, "messages": responder_messages(inst, None), **fields}
    assert baseline_key(inst, mode, "resp").digest == digest
