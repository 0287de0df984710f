"""`memstate experiment sycophancy`: the whole method on CPU (synthetic world, trained responder, GRPO, controls)."""

import json
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments

from memstate.cli import main
from memstate.data import load_split
from memstate.data_build.build import DataConfig, build_data
from memstate.data_build.synthetic import SyntheticConfig
from memstate.experiment.sycophancy import RememberingResponder, late_training_gain
from memstate.experiment.world import (
    FOLLOW_USER,
    TRUST_EVIDENCE,
    USE_LATEST,
    AnswerTokenTrainer,
    build_world_models,
    left_pad_collator,
    no_memory_letter,
    responder_examples,
    skill_examples,
    train_responder,
)
from memstate.responders.local import TransformersResponder
from memstate.reward.responder_score import judge

CONDITIONS = ("no_state", "self_guide", "checkpoint", "control_lr0", "control_shuffled")
TINY = ["--users", "120", "--responder_steps", "4", "--warmup_steps", "4", "--grpo_steps", "2", "--lr0_steps", "1",
        "--bootstrap_resamples", "200"]  # fmt: skip


def test_pipeline_writes_a_checkable_report_and_resumes(tmp_path):
    """Plumbing only (a few steps per stage, so no learning): every condition is evaluated on the same unseen users,
    the report holds what a script checks, the lr=0 control really kept its weights, a rerun redoes nothing."""
    out = tmp_path / "run"
    assert main(["experiment", "sycophancy", "--out", str(out), *TINY]) == 0
    report = json.loads((out / "report.json").read_text())
    assert set(report["conditions"]) == set(CONDITIONS)
    for cond in CONDITIONS[1:]:
        delta = report["conditions"][cond]["delta_vs_no_state"]
        assert delta["ci_low"] <= delta["mean"] <= delta["ci_high"]
    assert report["conditions"]["no_state"]["delta_vs_no_state"] is None
    assert report["control_lr0_weights_unchanged"] is True
    assert {r["group"] for r in report["records"]} == {r["group"] for r in report["records"] if r["task"]}
    assert report["n_test"] == len(report["records"]) > 0
    assert (out / "report.md").read_text().startswith("# Sycophancy world")
    assert (out / "report.png").stat().st_size > 0
    mtimes = {p: p.stat().st_mtime for p in out.rglob("model.safetensors")}
    assert main(["experiment", "sycophancy", "--out", str(out), *TINY]) == 0
    assert {p: p.stat().st_mtime for p in out.rglob("model.safetensors")} == mtimes


def test_late_training_gain_averages_the_logged_gain_over_the_second_half(tmp_path):
    log = [{"step": step, "memstate/gain_mean": gain} for step, gain in ((10, -1.0), (20, -1.0), (30, 0.2), (40, 0.4))]
    (tmp_path / "log_history.json").write_text(json.dumps([*log, {"step": 40, "train_runtime": 1.0}]))
    assert late_training_gain(tmp_path) == pytest.approx(0.3)
    assert late_training_gain(tmp_path / "never_ran") is None


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("world")
    config = DataConfig(sources={"synthetic": SyntheticConfig(users=120)},
                        split_ratios={"train": 0.7, "validation": 0.1, "test": 0.2}, progress=False)  # fmt: skip
    build_data(config, out / "data")
    train, validation = load_split(out / "data", "train"), load_split(out / "data", "validation")
    return out, train, validation, build_world_models(train, out / "models")


def test_skill_rows_are_where_a_lone_rule_changes_the_answer(world):
    _, _, validation, inits = world
    tokenizer = AutoTokenizer.from_pretrained(inits["responder"])
    rows = skill_examples(tokenizer, validation)
    skills = Counter(r["skill"] for r in rows)
    # "Use the older preference" agrees with the no-state answer everywhere, so it is no skill to check.
    assert set(skills) == {"no_state", "neutral", "no_memory", TRUST_EVIDENCE, FOLLOW_USER, USE_LATEST}
    assert skills["no_state"] == skills["neutral"] == len(validation[::3])
    assert skills["no_memory"] == len(validation[1::3])
    # With no memory shown a rule has nothing to act on: the row expects the no-memory answer, whatever the rule.
    for row in (r for r in rows if r["skill"] == "no_memory"):
        assert "Memories:\n(none)" in tokenizer.decode(row["input_ids"])
        assert tokenizer.convert_ids_to_tokens(row["label"]) in ("A", "C")
    conflicts = [i for i in validation if i.task == "evidence_conflict"]
    assert skills[TRUST_EVIDENCE] + skills[FOLLOW_USER] == len(conflicts)  # persuasive or not: one of them flips it
    for row in rows:
        assert row["input_ids"][-1] == row["label"]


def test_responder_trains_on_prompts_with_no_memory(world):
    _, train, _, inits = world
    tokenizer = AutoTokenizer.from_pretrained(inits["responder"])
    rows = responder_examples(tokenizer, train, seed=0, total=10 * len(train))
    bare = [r for r in rows if "Memories:\n(none)" in tokenizer.decode(r["input_ids"])]
    assert len(bare) == len(range(int(0.25 * len(rows)), len(rows), 12))  # the second phase's every 12th row
    assert not any("Memories:\n(none)" in tokenizer.decode(r["input_ids"]) for r in rows[: int(0.25 * len(rows))])
    letters = {no_memory_letter(i) for i in train}
    assert {tokenizer.convert_ids_to_tokens(r["label"]) for r in bare} <= letters
    assert any("Rules for using the memories" in tokenizer.decode(r["input_ids"]) for r in bare)


def test_responder_keeps_the_iterate_whose_weakest_skill_is_strongest(world):
    """8 checks on held-out users; the saved responder is the best-checked iterate (not the last), re-checked."""
    out, train, validation, inits = world
    responder = train_responder(inits["responder"], train, validation, out / "responder", steps=16,
                                learning_rate=1e-2, checks_from=0)  # fmt: skip
    logged = [h for h in json.loads((responder / "log_history.json").read_text()) if "eval_worst_skill" in h]
    checks = list({c["step"]: c for c in reversed(logged)}.values())[::-1]  # Trainer checks the last step twice
    assert [c["step"] for c in checks] == list(range(2, 17, 2))
    best = next(c for c in checks if c["eval_worst_skill"] == max(c["eval_worst_skill"] for c in checks))
    assert best["step"] != checks[-1]["step"] and best != checks[-1]  # else this test could not tell them apart
    tokenizer = AutoTokenizer.from_pretrained(responder)
    trainer = AnswerTokenTrainer(
        model=AutoModelForCausalLM.from_pretrained(responder),
        args=TrainingArguments(
            output_dir=str(out / "recheck"), use_cpu=True, report_to=[], per_device_eval_batch_size=64
        ),  # fmt: skip
        eval_dataset=skill_examples(tokenizer, validation),
        data_collator=left_pad_collator(tokenizer.pad_token_id),
    )
    again = trainer.evaluate()
    assert {k: v for k, v in again.items() if k.startswith("eval_")} == {
        k: v for k, v in best.items() if k.startswith("eval_")
    }
    assert not (responder / "checkpoints").exists()


def test_responder_checks_only_while_its_rate_decays(world):
    out, train, validation, inits = world
    responder = train_responder(inits["responder"], train, validation, out / "responder-late", steps=10)
    logged = [h for h in json.loads((responder / "log_history.json").read_text()) if "eval_worst_skill" in h]
    assert sorted({h["step"] for h in logged}) == [7, 8, 9, 10]  # every step (10 // 8) from the decay's start
    assert json.loads((responder / "selection.json").read_text())["kept_step"] in (7, 8, 9, 10)


@pytest.mark.parametrize("mode", ["likelihood", "exact"])
def test_remembering_responder_reads_each_prompt_once(world, mode):
    _, _, validation, inits = world
    plain = TransformersResponder(str(inits["responder"]), batch_size=4)
    read, method = [], "answer_logprob" if mode == "likelihood" else "answer"
    real = getattr(plain, method)
    remembering = RememberingResponder(plain)
    setattr(plain, method, lambda prompts, *rest, **kw: (read.append(len(prompts)), real(prompts, *rest, **kw))[1])
    a, b, c = validation[:3]
    first = judge(remembering, [a, b, a, b], [None, (TRUST_EVIDENCE,), None, (FOLLOW_USER,)], mode)
    assert read == [3] and first[0] == first[2]
    second = judge(remembering, [c, b, a], [None, (TRUST_EVIDENCE,), None], mode)
    assert read == [3, 1] and second[1:] == first[1::-1]
    direct = judge(plain, [a, b, c], [None, (FOLLOW_USER,), None], mode)
    for got, want in zip([first[0], first[3], second[0]], direct, strict=True):
        assert got.answer == want.answer and got.score == pytest.approx(want.score, abs=1e-5)


def test_micro_batches_compute_the_whole_batch_loss_and_gradient(world):
    """Rows run in length-sorted parts cut to their own width; loss, gradient and answer logits are the batch's."""
    _, train, _, inits = world
    tokenizer = AutoTokenizer.from_pretrained(inits["responder"])
    model = AutoModelForCausalLM.from_pretrained(inits["responder"])
    rows = responder_examples(tokenizer, train, seed=0, total=7)
    assert len({len(r["input_ids"]) for r in rows}) > 1  # else no padding to cut
    results = []
    for parts in (1, 3):
        trainer = SimpleNamespace(micro_batches=parts, prompt_lm_weight=1.0, processing_class=tokenizer)
        model.zero_grad()
        loss, logits = AnswerTokenTrainer.compute_loss(trainer, model, left_pad_collator(tokenizer.pad_token_id)(rows),
                                                       return_outputs=True)  # fmt: skip
        loss.backward()
        results.append((loss.detach(), logits.detach(), [p.grad.clone() for p in model.parameters()]))
    (loss1, logits1, grads1), (loss3, logits3, grads3) = results
    torch.testing.assert_close(loss3, loss1)
    torch.testing.assert_close(logits3, logits1, atol=1e-5, rtol=1e-4)
    for a, b in zip(grads3, grads1, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
