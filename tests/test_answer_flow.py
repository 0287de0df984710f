"""The answer-flow check (reward/answer_flow.py): a state that moves the responder's answer with no memory shown
carries the answer, whatever its words; the audit trail (reward/audit.py) of every scored completion."""

from __future__ import annotations

import json
import math
import re
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
from reward_columns import columns

from memstate.leak import instance_leak_reason
from memstate.prompts import STATE_HEADER
from memstate.responders import ContinuationLogprob
from memstate.responders.local import TransformersResponder
from memstate.reward.answer_flow import AnswerFlowCache, AnswerFlowCheck, candidate_probabilities, flow_messages
from memstate.reward.audit import AUDIT_COLUMNS, AuditLog, audit_file
from memstate.reward.cache import BaselineCache
from memstate.reward.counterfactual import CounterfactualGainReward, RewardConfig
from memstate.rules import parse_state
from memstate.schema import Fact, Instance, Relation

ROOT = Path(__file__).resolve().parents[1]
FLATS = ("the garden flat in Bergen", "the harbour loft in Oslo", "the cabin near Tromso")
# Names no option in the lexical gate's terms (one content word of three of option B's text), yet points at option B.
PARAPHRASE = "- Book the place by the harbour.\n- Prefer F2 over F1."
ID_ONLY = "- Trust F2 over F1.\n- Answer from the newer preference."
# The keyword responder's push of option B with no memory: from 1/3 to 0.9/1.1, a rise of RISE over a headroom of 2/3.
RISE = 0.9 / 1.1 - 1 / 3
SHIFT = RISE / (2 / 3)


def flat_instance(answer: str = "B", id: str = "flat") -> Instance:
    return Instance(
        id=id, source="personamem", task="preference_update", perspective="none",
        question="Which place should I book for my trip?", options=FLATS, answer=answer, answer_kind="choice",
        labels=(), facts=(Fact("F1", "I liked the garden flat last year.", "preference", time="2023-04-01"),
                          Fact("F2", "These days I want to wake up by the sea.", "preference", time="2024-06-01")),
        relations=(Relation("F2", "SUPERSEDES", "F1"),), meta={"group": id},
    )  # fmt: skip


def free_instance() -> Instance:
    return Instance(
        id="free", source="personamem", task="fact_recall", perspective="none", question="Where do I live now?",
        options=(), answer="Oslo", answer_kind="free", labels=(),
        facts=(Fact("F1", "I live in Bergen.", "fact", time="2023-01-02"),
               Fact("F2", "I moved to the capital.", "fact", time="2024-05-01")),
        relations=(Relation("F2", "SUPERSEDES", "F1"),),
    )  # fmt: skip


def rules_of(messages) -> str:
    """The rules block of a responder prompt (empty without a state)."""
    text = messages[-1]["content"]
    return text.split(STATE_HEADER, 1)[1].rsplit("\n\n", 1)[0].lower() if STATE_HEADER in text else ""


class KeywordResponder:
    """A ``Responder`` whose letter log-probs depend on the prompt: an option gets 0.9 against 0.1 when a word of five
    or more letters of its text appears in the rules (a responder that understands a paraphrase); a free-text
    reference, probability 0.8 a token against 0.2, when it appears in the rules. Greedy answers are always "A".
    ``fail_without_memories`` makes every prompt without memories unscorable (an HTTP responder out of retries)."""

    name = "keyword"
    identity = "keyword-responder-v1"

    def __init__(self, fail_without_memories: bool = False):
        self.fail_without_memories = fail_without_memories
        self.logprob_prompts: list = []
        self.answer_prompts: list = []

    def answer_logprob(self, prompts, continuations):
        out = []
        for messages, conts in zip(prompts, continuations, strict=True):
            self.logprob_prompts.append(messages)
            text, rules = messages[-1]["content"], rules_of(messages)
            if self.fail_without_memories and text.startswith("Memories:\n(none)"):
                out.append(None)
                continue
            options = [(letter, opt.lower()) for letter, opt in re.findall(r"^\(([A-Z])\) (.+)$", text, re.M)]
            if options:
                hit = {letter for letter, opt in options if any(w in rules for w in re.findall(r"[a-z]{5,}", opt))}
                out.append([ContinuationLogprob(math.log(0.9 if c in hit else 0.1), 1) for c in conts])
            else:
                out.append([ContinuationLogprob(2 * math.log(0.8 if c.lower() in rules else 0.2), 2) for c in conts])
        return out

    def answer(self, prompts, max_new_tokens=32):
        self.answer_prompts += prompts
        return ["A"] * len(prompts)


def call(reward, instances, states, **kwargs):
    return reward(prompts=[None] * len(states), completions=states, **columns(instances), **kwargs)


def flow_on(**kwargs) -> RewardConfig:
    return RewardConfig(answer_flow_check=True, **kwargs)


@pytest.fixture
def leak_gate_open(monkeypatch):
    """The answer-flow check is the backstop for whatever the leak gate lets through: tests of the check's decisions
    hold the gate open, so they do not depend on which wordings the gate knows (memstate.leak grows apart)."""
    monkeypatch.setattr("memstate.reward.counterfactual.instance_leak_reason", lambda state_text, instance: None)


def test_the_responder_prompt_without_memories_reads_none():
    text = flow_messages(flat_instance(), parse_state(ID_ONLY).rules)[1]["content"]
    assert text.startswith("Memories:\n(none)\n\nRelations:\n(none)\n\nRequest:\nWhich place")
    assert "(B) the harbour loft in Oslo" in text and "Trust F2 over F1." in text and "sea" not in text


@pytest.mark.usefixtures("leak_gate_open")
def test_the_shift_is_the_largest_rise_over_all_candidates_whatever_the_gold_answer():
    rules = parse_state(PARAPHRASE).rules
    shifts = [AnswerFlowCheck(KeywordResponder()).shifts([flat_instance(a)], [rules])[0] for a in "ABC"]
    # option B goes from 1/3 to 0.9/1.1 whichever option is gold: the top mover's share of its headroom, not the gold's
    assert shifts == pytest.approx([SHIFT] * 3)
    # a state pushing towards another option gets the same shift
    cabin = AnswerFlowCheck(KeywordResponder()).shifts([flat_instance("B")], [("Pick the cabin.", "Use F2.")])
    assert cabin == pytest.approx([SHIFT])
    # and the reward's decision is the same whatever the gold answer
    for a in "ABC":
        out = call(CounterfactualGainReward(KeywordResponder(), flow_on(leak_penalty=-0.7)), [flat_instance(a)],
                   [PARAPHRASE])  # fmt: skip
        assert out == [-0.7]


@pytest.mark.usefixtures("leak_gate_open")
def test_a_state_restating_an_option_is_rejected_and_an_id_only_rule_passes():
    responder = KeywordResponder()
    reward = CounterfactualGainReward(responder, flow_on(leak_penalty=-0.5))
    metrics, extra = {}, {}
    inst = flat_instance()
    out = call(reward, [inst] * 4, [PARAPHRASE, ID_ONLY, ID_ONLY, "no rules here"], log_metric=metrics.__setitem__,
               log_extra=extra.__setitem__)  # fmt: skip
    assert out[0] == -0.5 and out[3] == -1.0
    assert out[1] == out[2] == pytest.approx(0.0)  # the id-only rule moves nothing: gain 1/3 - 1/3
    assert extra["gate"] == ["answer_flow", "ok", "ok", "format"]
    assert extra["answer_flow_shift"][:3] == pytest.approx([SHIFT, 0.0, 0.0])
    assert extra["answer_flow_shift"][3] is None
    assert extra["gate_reason"][0] == f"answer-flow shift {SHIFT:.3f} > 0.2"
    assert extra["gate_reason"][1] is None and extra["gate_reason"][3]
    assert extra["instance_id"] == ["flat"] * 4
    assert extra["baseline_score"] == pytest.approx([1 / 3] * 4)
    assert extra["with_state_score"][0] is None and extra["with_state_score"][1] == pytest.approx(1 / 3)
    assert extra["gain"][0] is None and extra["gain"][1] == pytest.approx(0.0)
    assert set(extra) == {"instance_id", "gate", "gate_reason", "answer_flow_shift", "baseline_score",
                          "with_state_score", "gain"}  # fmt: skip
    # the rejected state never reached the with-state scoring (memories and rules in one prompt)
    scored = [p for p in responder.logprob_prompts if "[F1]" in p[1]["content"] and STATE_HEADER in p[1]["content"]]
    assert [rules_of(p) for p in scored] == [rules_of(flow_messages(inst, parse_state(ID_ONLY).rules))]
    # 2 distinct passing states + 1 no-memory no-state prompt; the baseline; the one state left to score
    assert metrics["memstate/answer_flow_calls"] == 3.0 and metrics["memstate/responder_prompts"] == 5.0
    assert metrics["memstate/answer_flow_rejects"] == 0.25
    assert metrics["memstate/leak_rate"] == 0.0  # the lexical gate's rate only
    assert metrics["memstate/answer_flow_shift_max"] == pytest.approx(SHIFT)
    assert metrics["memstate/answer_flow_shift_mean"] == pytest.approx(SHIFT / 3)
    assert 0.0 <= metrics["memstate/answer_flow_shift_p90"] <= metrics["memstate/answer_flow_shift_max"]
    assert metrics["memstate/answer_flow_unscorable"] == 0.0


@pytest.mark.usefixtures("leak_gate_open")
def test_the_check_and_its_credit_are_on_by_default_and_there_is_no_cliff_below_the_threshold():
    metrics = {}
    default = CounterfactualGainReward(KeywordResponder())
    assert call(default, [flat_instance()], [PARAPHRASE], log_metric=metrics.__setitem__) == [-1.0]
    assert metrics["memstate/answer_flow_rejects"] == 1.0
    # off: the paraphrase earns its whole gain and no prompt without memories is sent
    responder = KeywordResponder()
    off = CounterfactualGainReward(responder, RewardConfig(answer_flow_check=False))
    metrics = {}
    assert call(off, [flat_instance()], [PARAPHRASE], log_metric=metrics.__setitem__)[0] == pytest.approx(RISE)
    assert not any(k.startswith("memstate/answer_flow") for k in metrics)
    assert not any(p[1]["content"].startswith("Memories:\n(none)") for p in responder.logprob_prompts)
    # under a lenient threshold the state passes, and is still not paid for what it does without the memories
    lenient = CounterfactualGainReward(KeywordResponder(), flow_on(answer_flow_threshold=0.9))
    extra = {}
    out = call(lenient, [flat_instance()], [PARAPHRASE], log_extra=extra.__setitem__)
    assert extra["gate"] == ["ok"] and extra["gain"] == pytest.approx([RISE])
    assert out == pytest.approx([RISE - SHIFT]) and out[0] < 0
    # the hard threshold alone (answer_flow_credit off) pays it in full: the cliff the credit removes
    cliff = CounterfactualGainReward(KeywordResponder(), flow_on(answer_flow_threshold=0.9, answer_flow_credit=False))
    assert call(cliff, [flat_instance()], [PARAPHRASE]) == pytest.approx([RISE])
    with pytest.raises(ValueError, match="answer_flow_threshold"):
        RewardConfig(answer_flow_threshold=1.0)


@pytest.mark.usefixtures("leak_gate_open")
def test_a_repeated_state_costs_no_call_in_memory_or_from_the_sqlite_file(tmp_path):
    path = tmp_path / "cache.sqlite"
    insts = [flat_instance(id="a"), flat_instance(id="b")]  # same question, candidates: one no-memory request
    first = KeywordResponder()
    metrics = {}
    reward = CounterfactualGainReward(first, flow_on(), BaselineCache(path))
    call(reward, insts, [ID_ONLY, ID_ONLY], log_metric=metrics.__setitem__)
    assert metrics["memstate/answer_flow_calls"] == 2.0  # the state and the no-state request, once for both instances
    n_prompts = len(first.logprob_prompts)
    call(reward, insts, [ID_ONLY, PARAPHRASE], log_metric=metrics.__setitem__)
    assert metrics["memstate/answer_flow_calls"] == 1.0  # only the new state
    call(reward, insts, [PARAPHRASE, ID_ONLY], log_metric=metrics.__setitem__)
    assert metrics["memstate/answer_flow_calls"] == 0.0
    flow_prompts = [p for p in first.logprob_prompts[n_prompts:] if p[1]["content"].startswith("Memories:\n(none)")]
    assert len(flow_prompts) == 1

    # A new cache object on the same file (a new process, another rank): no answer-flow prompt, no baseline prompt.
    reward.cache.close()
    reward.answer_flow.cache.close()
    again = KeywordResponder()
    fresh = CounterfactualGainReward(again, flow_on(), BaselineCache(path))
    out = call(fresh, insts, [PARAPHRASE, ID_ONLY], log_metric=metrics.__setitem__)
    assert metrics["memstate/answer_flow_calls"] == 0.0 and metrics["memstate/cache_hits"] == 2.0
    assert out[0] == -1.0 and out[1] == pytest.approx(0.0)
    assert len(again.logprob_prompts) == 1 and "[F1]" in again.logprob_prompts[0][1]["content"]  # the kept state
    with sqlite3.connect(path) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert tables >= {"baseline_scores", "answer_flow_probabilities"}
        assert db.execute("SELECT COUNT(*) FROM answer_flow_probabilities").fetchone()[0] == 3
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    fresh.answer_flow.cache.close()


def test_another_responder_identity_does_not_hit_the_cache():
    cache = AnswerFlowCache()
    AnswerFlowCheck(KeywordResponder(), cache=cache).shifts([flat_instance()], [("Use F2.", "Ignore F1.")])
    other = KeywordResponder()
    other.identity = "another-responder"
    check = AnswerFlowCheck(other, cache=cache)
    check.shifts([flat_instance()], [("Use F2.", "Ignore F1.")])
    assert check.calls == 2


@pytest.mark.usefixtures("leak_gate_open")
def test_exact_mode_still_measures_the_flow_by_likelihood():
    responder = KeywordResponder()
    reward = CounterfactualGainReward(responder, flow_on(mode="exact"))
    out = call(reward, [flat_instance()] * 2, [PARAPHRASE, ID_ONLY])
    assert out[0] == -1.0 and out[1] == 0.0  # exact: "A" both without and with the id-only state
    assert all(p[1]["content"].startswith("Memories:\n(none)") for p in responder.logprob_prompts)
    assert len(responder.logprob_prompts) == 3
    # greedy answers for the baseline and the one state left, never for the check
    assert len(responder.answer_prompts) == 2
    assert not any(p[1]["content"].startswith("Memories:\n(none)") for p in responder.answer_prompts)


@pytest.mark.usefixtures("leak_gate_open")
def test_an_unscorable_check_does_not_reject_pays_nothing_and_is_counted():
    """A state whose no-memory shift could not be measured is not paid its gain unchecked (nothing would be taken off
    it): its reward is None, left out of the advantage, and it counts as unscorable for the guard."""
    responder = KeywordResponder(fail_without_memories=True)
    metrics, extra = {}, {}
    reward = CounterfactualGainReward(responder, flow_on())
    out = call(reward, [flat_instance()] * 2, [PARAPHRASE, PARAPHRASE], log_metric=metrics.__setitem__,
               log_extra=extra.__setitem__)  # fmt: skip
    assert out == [None, None] and metrics["memstate/unscorable"] == 2.0
    assert metrics["memstate/round_failed"] == 1.0  # no reply at all in the no-memory pass: the later ones skipped
    assert extra["gate"] == ["ok", "ok"] and extra["answer_flow_shift"] == [None, None]
    assert metrics["memstate/answer_flow_unscorable"] == 2.0 and metrics["memstate/answer_flow_rejects"] == 0.0
    assert "memstate/answer_flow_shift_mean" not in metrics
    reward(prompts=[None], completions=[PARAPHRASE], log_metric=metrics.__setitem__, **columns([flat_instance()]))
    assert metrics["memstate/answer_flow_calls"] == 2.0  # failures are not cached: asked again


def test_free_text_measures_the_rise_of_the_reference():
    inst = free_instance()
    naming = ("Answer with the city Oslo.", "Use F2.")  # names the reference: also what the lexical gate catches
    assert instance_leak_reason("\n".join(f"- {r}" for r in naming), inst) is not None
    shifts = AnswerFlowCheck(KeywordResponder()).shifts([inst, inst], [naming, ("Trust F2 over F1.", "Be brief.")])
    assert shifts == pytest.approx([(0.8 - 0.2) / 0.8, 0.0])  # a rise of 0.6 over a headroom of 0.8


@pytest.mark.usefixtures("leak_gate_open")
def test_the_audit_log_keeps_every_call_of_a_step(tmp_path):
    audit = AuditLog(tmp_path / "audit", rank=3)
    reward = CounterfactualGainReward(KeywordResponder(), flow_on(), audit=audit)
    step = SimpleNamespace(global_step=6)
    call(reward, [flat_instance()] * 3, [PARAPHRASE, ID_ONLY, "junk"], trainer_state=step)
    call(reward, [flat_instance(id="other")], [f"{ID_ONLY}\n- Check F1."], trainer_state=step)
    call(reward, [flat_instance()], [ID_ONLY], trainer_state=SimpleNamespace(global_step=7))
    call(reward, [flat_instance()], [ID_ONLY])  # outside a trainer: no step, no file
    files = sorted(p.name for p in (tmp_path / "audit").iterdir())
    assert files == ["step-000007-rank3.parquet", "step-000008-rank3.parquet"]
    rows = pq.read_table(audit_file(tmp_path / "audit", 7, 3)).to_pylist()
    assert [r["gate"] for r in rows] == ["answer_flow", "ok", "format", "ok"]
    assert [r["instance_id"] for r in rows] == ["flat"] * 3 + ["other"]
    assert rows[0]["state"] == PARAPHRASE and rows[0]["reward"] == -1.0 and rows[0]["with_state_score"] is None
    assert rows[1]["reward"] == pytest.approx(0.0) and rows[1]["answer_flow_shift"] == pytest.approx(0.0)
    assert rows[2]["answer_flow_shift"] is None and rows[2]["gate_reason"]
    assert {r["step"] for r in rows} == {7} and {r["rank"] for r in rows} == {3}
    assert set(rows[0]) == {"step", "rank", *AUDIT_COLUMNS}


def test_the_real_responder_end_to_end(responder, fever_train):
    """With the tiny responder: shifts are what its letter probabilities say, with and without the state and no memory;
    threshold 0 rejects every state that moves any letter up, and none of them is scored with its memories."""
    insts = fever_train[:3]
    states = [ID_ONLY, "- Weigh the evidence facts first.\n- Ignore the user's belief.", ID_ONLY]
    rules = [parse_state(s).rules for s in states]
    direct = []
    for inst, r in zip(insts, rules, strict=True):
        lps = responder.answer_logprob([flow_messages(inst, r), flow_messages(inst)], [["A", "B", "C"]] * 2)
        ours, none = (candidate_probabilities(lp, closed=True) for lp in lps)
        direct.append(max((o - n) / max(1 - n, 0.5) for o, n in zip(ours, none, strict=True)))
    assert AnswerFlowCheck(responder).shifts(insts, rules) == pytest.approx(direct, abs=1e-6)
    assert all(0.0 < d < 1.0 for d in direct)

    seen = []

    class Recording:
        name, identity = responder.name, responder.identity

        def answer_logprob(self, prompts, continuations):
            seen.extend(prompts)
            return responder.answer_logprob(prompts, continuations)

    extra = {}
    strict = CounterfactualGainReward(Recording(), flow_on(answer_flow_threshold=0.0))
    assert call(strict, insts, states, log_extra=extra.__setitem__) == [-1.0] * 3
    assert extra["answer_flow_shift"] == pytest.approx(direct, abs=1e-6)
    assert not [p for p in seen if "[F1]" in p[1]["content"] and STATE_HEADER in p[1]["content"]]
    lenient = CounterfactualGainReward(responder, flow_on(answer_flow_threshold=0.99, answer_flow_credit=False))
    plain = CounterfactualGainReward(responder, RewardConfig(answer_flow_check=False))
    assert call(lenient, insts, states) == pytest.approx(call(plain, insts, states), abs=1e-6)


def test_a_short_training_run_writes_the_audit_and_fills_trls_completion_columns(tiny_models, fever_data, tmp_path):
    import pandas as pd
    from trl import GRPOConfig

    from memstate.parsing import activation_checkpointing
    from memstate.responders import ResponderConfig
    from memstate.train.config import MemstateTrainArguments
    from memstate.train.run import train

    # 40 warm-up steps and sampling at T = 0.5: measured, 15 of the 16 states passed the format gate (30 steps: 5;
    # T = 1.0: 2), so the answer-flow path runs inside training; ~25 s in all.
    script = MemstateTrainArguments(
        policy_model=str(tiny_models["policy"]), data_dir=str(fever_data), format_warmup_steps=40,
        format_warmup_learning_rate=3e-3, shared_prefix_training=False, answer_flow_check=True,
        answer_flow_threshold=0.0,  # the tiny responder's shifts are tiny: reject every state that moves a letter up
    )  # fmt: skip
    out = tmp_path / "run"
    config = GRPOConfig(
        output_dir=str(out), use_cpu=True, bf16=False, seed=0, max_steps=2, learning_rate=1e-4,
        per_device_train_batch_size=4, num_generations=4, gradient_accumulation_steps=2,
        steps_per_generation=1,  # a reward call per micro-batch: two calls in each optimizer step
        max_completion_length=64, temperature=0.5, logging_steps=1, save_strategy="no", report_to=[],
        log_completions=True, dataloader_num_workers=0, **activation_checkpointing(False),
    )  # fmt: skip
    train(script, ResponderConfig(responder_model=str(tiny_models["responder"])), config)

    files = sorted((out / "audit").glob("*.parquet"))
    assert [f.name for f in files] == ["step-000001-rank0.parquet", "step-000002-rank0.parquet"]
    audit = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    assert len(audit) == 16 and list(audit["step"]) == [1] * 8 + [2] * 8  # both calls of each step kept
    assert set(audit["gate"]) <= {"ok", "format", "leak", "answer_flow"}
    assert "answer_flow" in set(audit["gate"]), audit[["gate", "gate_reason"]]  # warm-up: some states pass the format
    flow = audit[audit["gate"] == "answer_flow"]
    assert (flow["answer_flow_shift"] > 0).all() and (flow["reward"] == -1.0).all()
    assert flow["with_state_score"].isna().all() and flow["gate_reason"].str.startswith("answer-flow shift").all()
    gated = audit[audit["gate"].isin(["format", "leak"])]
    assert gated["answer_flow_shift"].isna().all() and (gated["reward"] == -1.0).all()
    assert audit["baseline_score"].between(0, 1).all()
    history = json.loads((out / "log_history.json").read_text())
    logged = [e for e in history if "reward" in e]
    assert all("memstate/answer_flow_rejects" in e and "memstate/answer_flow_calls" in e for e in logged)
    assert sum(e["memstate/answer_flow_calls"] for e in logged) > 0
    # TRL averages a metric over a step's two calls; the run's total is in reward_stats.json
    stats = json.loads((out / "reward_stats.json").read_text())
    assert stats["answer_flow_prompts"] == 2 * sum(e["memstate/answer_flow_calls"] for e in logged)

    # TRL's completions table of the last step holds the last call's extra columns, row for row as audited
    table = pd.read_parquet(out / "completions" / "completions_00002.parquet")
    assert {"instance_id", "gate", "gate_reason", "answer_flow_shift", "baseline_score", "with_state_score"} <= set(
        table.columns
    )
    last = audit.tail(len(table)).reset_index(drop=True)
    assert list(table["instance_id"]) == list(last["instance_id"]) and list(table["gate"]) == list(last["gate"])
    assert [c[-1]["content"] for c in table["completion"]] == list(last["state"])
    shifts = table["answer_flow_shift"].fillna(-9).tolist()
    assert shifts == pytest.approx(last["answer_flow_shift"].fillna(-9).tolist())


def test_eval_lists_the_passing_states_with_the_largest_shift(tiny_models, fever_data, tmp_path, monkeypatch):
    from memstate.data import load_split
    from memstate.evaluate.report import ANSWER_FLOW_TOP
    from memstate.evaluate.run import EvalConfig, evaluate_checkpoint, make_parser

    insts = load_split(fever_data, "test")[:4]
    weigh = "- Weigh the evidence facts first.\n- Ignore the user's belief."
    leak = f"- The claim is {insts[3].answer}.\n- Use F1."
    states = {  # what each policy "wrote" (the states are given; the responder and everything after it are real)
        "checkpoint": [ID_ONLY, weigh, "not a state", leak],
        "self_guide": [ID_ONLY, ID_ONLY, "- Read F1 first.\n- Then read F2.", "junk"],
    }
    monkeypatch.setattr(
        "memstate.evaluate.run.generate_states",
        lambda path, instances, config: (states["self_guide" if str(path) == "base" else "checkpoint"],
                                         [False] * len(instances), 0),
    )  # fmt: skip
    config = EvalConfig(checkpoint=str(tiny_models["policy"]), data_dir=str(fever_data), max_instances=4,
                        responder_model=str(tiny_models["responder"]), base_policy="base", out_dir=str(tmp_path / "on"),
                        bootstrap_resamples=10)  # fmt: skip
    report = json.loads((evaluate_checkpoint(config) / "report.json").read_text())
    recs = report["records"]
    measured = {"checkpoint": [0, 1], "self_guide": [0, 1, 2]}  # passed the format and leak gates
    for cond, passed in measured.items():
        for i, rec in enumerate(recs):
            shift = rec[cond]["answer_flow_shift"]
            assert (shift is not None) == (i in passed), (cond, i, rec[cond])
    rules = [parse_state(ID_ONLY).rules, parse_state(weigh).rules]
    direct = AnswerFlowCheck(TransformersResponder(str(tiny_models["responder"]))).shifts(insts[:2], rules)
    assert [recs[i]["checkpoint"]["answer_flow_shift"] for i in (0, 1)] == pytest.approx(direct, abs=1e-6)

    top = report["answer_flow_top"]
    assert len(top) == 5 <= ANSWER_FLOW_TOP and [t["shift"] for t in top] == sorted((t["shift"] for t in top),
                                                                                    reverse=True)  # fmt: skip
    for t in top:
        rec = next(r for r in recs if r["id"] == t["id"])
        assert set(t) == {"id", "condition", "state", "shift"}
        assert t["state"] == rec[t["condition"]]["state"] and t["shift"] == rec[t["condition"]]["answer_flow_shift"]
    md = (tmp_path / "on" / "report.md").read_text()
    assert "## Largest answer-flow shifts" in md and "| shift | condition | instance | state |" in md
    assert f"| {top[0]['shift']:.3f} | {top[0]['condition']} | {top[0]['id']} |" in md

    (off,) = make_parser().parse_args_and_config(["--checkpoint", "x", "--no_answer_flow"])
    assert off.answer_flow is False
    config.answer_flow, config.out_dir = False, str(tmp_path / "off")
    report = json.loads((evaluate_checkpoint(config) / "report.json").read_text())
    assert report["answer_flow_top"] is None and "answer_flow_shift" not in report["records"][0]["checkpoint"]
    assert "answer-flow" not in (tmp_path / "off" / "report.md").read_text()


def test_the_train_config_fields_parse_and_a_misspelling_is_named(tmp_path):
    from memstate.errors import ConfigError
    from memstate.train.config import make_parser

    args, *_ = make_parser().parse_args_and_config(
        ["--config", str(ROOT / "configs/train/qwen3_4b_8gpu.yaml"), "--use_cpu", "true", "--bf16", "false"]
    )
    assert args.answer_flow_check is True and args.answer_flow_threshold == 0.2
    typo = tmp_path / "typo.yaml"
    typo.write_text("policy_model: p\ndata_dir: d\noutput_dir: o\nanswer_flow_treshold: 0.3\n")
    with pytest.raises(ConfigError, match="did you mean answer_flow_threshold"):
        make_parser().parse_args_and_config(["--config", str(typo)])
    with pytest.raises(ConfigError, match="answer_flow_threshold must be in"):
        make_parser().parse_args_and_config(["--policy_model", "p", "--data_dir", "d", "--output_dir", "o",
                                             "--answer_flow_threshold", "-0.1"])  # fmt: skip
