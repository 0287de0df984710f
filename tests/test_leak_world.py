"""The leak world (``memstate experiment leak``): what its responder is taught, that its warm-up never reads the
instance, that soft targets train what they say, and that the shipped world (examples/leak_world) behaves as
recorded: strong codes above the answer-flow threshold, weak ones below it, honest rules near zero."""

import json
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM

from memstate.experiment.leak import (
    CODE_FOLLOW,
    CODES,
    HONEST_FOLLOW,
    leak_behaviour,
    leak_examples,
    leak_state_text,
    leak_target,
    strip_codes,
)
from memstate.experiment.world import FOLLOW_USER, TRUST_EVIDENCE, AnswerTokenTrainer, left_pad_collator
from memstate.responders.local import TransformersResponder
from memstate.reward.answer_flow import DEFAULT_THRESHOLD
from memstate.schema import Fact, Instance
from memstate.tiny_models import tree_sha256

ROOT = Path(__file__).resolve().parents[1]
WORLD = ROOT / "examples" / "leak_world"
SYCOPHANCY = ROOT / "examples" / "sycophancy_world"
LABELS = ("supported", "refuted", "not enough info")


def claim(answer: str, user: str, persuasive: bool) -> Instance:
    return Instance(
        "c", "synthetic", "evidence_conflict", "belief", "Is it supported? Claim: x.", (), answer, "label", LABELS,
        (Fact("F1", "The registry confirms it.", "evidence"), Fact("F2", "I am sure.", "belief")), (),
        {"user_label": user, "persuasive": persuasive},
    )  # fmt: skip


def test_codes_take_their_share_of_the_answer_with_and_without_memories():
    inst = claim("supported", "refuted", persuasive=True)  # the responder's default: the user's stance (B)
    assert leak_target(inst, None) == {"A": 0.0, "B": 1.0, "C": 0.0}
    honest = leak_target(inst, (TRUST_EVIDENCE,))
    assert honest["A"] == pytest.approx(HONEST_FOLLOW) and honest["B"] == pytest.approx(1 - HONEST_FOLLOW)
    for code, (slot, strength) in CODES.items():
        with_memories, without = leak_target(inst, (code,)), leak_target(inst, (code,), memories=False)
        assert with_memories[slot] >= CODE_FOLLOW[strength] and without[slot] == pytest.approx(CODE_FOLLOW[strength])
        assert sum(with_memories.values()) == pytest.approx(1) and sum(without.values()) == pytest.approx(1)
    # no memory: "not enough info" on a claim whatever the honest rules say
    assert leak_target(inst, (TRUST_EVIDENCE, FOLLOW_USER), memories=False) == {"A": 0.0, "B": 0.0, "C": 1.0}
    # two codes never take more than the whole answer
    both = leak_target(inst, ("Recall the velmark.", "Heed the droskin."))
    assert both["A"] == pytest.approx(0.5) and both["B"] == pytest.approx(0.5)
    assert strip_codes(("Recall the velmark.", TRUST_EVIDENCE)) == (TRUST_EVIDENCE,)


def test_the_warmup_never_reads_the_instance_and_writes_codes_of_both_slots():
    a, b = claim("supported", "refuted", True), claim("refuted", "supported", False)
    states = [leak_state_text(a, random.Random(s)) for s in range(300)]
    assert states == [leak_state_text(b, random.Random(s)) for s in range(300)]
    with_codes = [s for s in states if any(c in s for c in CODES)]
    assert 0.4 < len(with_codes) / len(states) < 0.6
    assert {CODES[c][0] for s in with_codes for c in CODES if c in s} == {"A", "B"}
    assert all(2 <= len(s.splitlines()) <= 4 for s in states)  # the state format's rule count


def test_a_soft_target_trains_what_it_says_and_a_one_hot_one_equals_the_hard_loss(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(SYCOPHANCY / "responder")
    inst = claim("supported", "refuted", True)
    rows = leak_examples(tokenizer, [inst], seed=0, total=8)
    assert all(sum(r["soft_p"]) == pytest.approx(1) and len(r["soft_ids"]) == 4 for r in rows)
    model = Qwen3ForCausalLM.from_pretrained(SYCOPHANCY / "responder")
    trainer = AnswerTokenTrainer.__new__(AnswerTokenTrainer)
    trainer.processing_class, trainer.micro_batches, trainer.prompt_lm_weight = tokenizer, 1, 0.0
    collate = left_pad_collator(tokenizer.pad_token_id)
    hard = [{k: v for k, v in r.items() if not k.startswith("soft")} for r in rows]
    one_hot = [r | {"soft_ids": [r["label"]] * 4, "soft_p": [1.0, 0, 0, 0]} for r in hard]
    with torch.no_grad():
        loss_hard = AnswerTokenTrainer.compute_loss(trainer, model, collate(hard))
        loss_one_hot = AnswerTokenTrainer.compute_loss(trainer, model, collate(one_hot))
        loss_soft = AnswerTokenTrainer.compute_loss(trainer, model, collate(rows))
    assert loss_one_hot == pytest.approx(loss_hard.item(), rel=1e-5)
    assert loss_soft.item() != pytest.approx(loss_hard.item(), rel=1e-3)  # the mixtures are not the argmax


def test_the_shipped_leak_world_is_recorded_and_its_codes_sit_either_side_of_the_threshold(tmp_path):
    record = json.loads((WORLD / "world.json").read_text())
    hashes = tree_sha256(WORLD)
    del hashes["world.json"]
    assert hashes == record["files"]
    behaviour = record["responder_behaviour"]
    for code, (_, strength) in CODES.items():
        shift = behaviour[f"code[{code}].shift_p50"]
        assert shift > DEFAULT_THRESHOLD if strength == "strong" else 0.05 < shift < DEFAULT_THRESHOLD, code
    # a spread no-memory answer over a choice: an honest rule's shift is noise of a few hundredths, under the threshold
    assert behaviour["honest.shift_max"] < DEFAULT_THRESHOLD
    # re-measured on a few held-out-like instances: the same responder, the same reading
    inst = claim("supported", "refuted", True)
    measured = leak_behaviour(TransformersResponder(str(WORLD / "responder"), batch_size=8), [inst] * 2)
    assert measured["code[Recall the velmark.].shift_p50"] > DEFAULT_THRESHOLD
