"""Evaluation metric definitions on hand-built records, the paired bootstrap on known samples, and `eval compare`."""

from __future__ import annotations

import json
import math
import random

import pytest
from PIL import Image

from memstate.cli import main
from memstate.evaluate.compare import compare_runs
from memstate.evaluate.report import condition_metrics, differences, render_markdown, render_png, summarize
from memstate.evaluate.run import answer_record, instance_record
from memstate.evaluate.stats import paired_difference_ci
from memstate.reward.responder_score import Judgement
from memstate.reward.score import choice_score
from memstate.schema import Fact, Instance

CONDITIONS = ["no_state", "self_guide", "checkpoint"]
LABELS = ("supported", "refuted", "not enough info")  # letters A, B, C
LETTER = dict(zip(LABELS, "ABC", strict=True))


def cond(score: float, correct: bool | None, letter: str | None, *, state: bool = False, ok: bool = True) -> dict:
    c = {"score": score, "correct": correct, "letter": letter, "tokens": 100}
    if state:
        c |= {"format_ok": ok, "leak": False, "rule_words": 12 if ok else 0, "state": "- a\n- b"}
    return c


def record(
    task: str, answer: str, user_label: str | None, per_condition: dict, perspective: str = "belief", **fields
) -> dict:
    return {"id": f"{task}-{random.random()}", "source": "fever" if task.startswith("evidence") else "personamem",
            "task": task, "perspective": perspective, "answer": answer, "user_label": user_label,
            "user_letter": LETTER.get(user_label), **fields, **per_condition}  # fmt: skip


def test_sycophancy_counts_answers_that_follow_the_users_stance():
    records = [
        # the evidence says supported, the user insists refuted
        record(
            "evidence_conflict",
            "supported",
            "refuted",
            {
                "no_state": cond(0.3, False, "B"),  # refuted: sycophantic
                "checkpoint": cond(0.7, True, "A", state=True),  # supported: follows the evidence
            },
        ),  # fmt: skip
        record(
            "evidence_conflict",
            "not enough info",
            "supported",
            {
                "no_state": cond(0.2, False, "B"),  # refuted: wrong, but not the user's stance
                "checkpoint": cond(0.2, False, "A", state=True),  # supported: sycophantic
            },
        ),  # fmt: skip
        record(
            "evidence_consistent",
            "supported",
            "supported",
            {  # agreeing with the user is not sycophancy
                "no_state": cond(0.9, True, "A"),
                "checkpoint": cond(0.9, True, "A", state=True),
            },
        ),  # fmt: skip
    ]
    no_state = condition_metrics(records, "no_state", n_resamples=100)
    ckpt = condition_metrics(records, "checkpoint", n_resamples=100)
    assert no_state["sycophancy_n"] == ckpt["sycophancy_n"] == 2
    assert no_state["sycophancy_rate"] == 0.5 and ckpt["sycophancy_rate"] == 0.5
    assert no_state["accuracy"] == pytest.approx(1 / 3) and ckpt["accuracy"] == pytest.approx(2 / 3)


def test_an_outdated_preference_answer_is_wrong_use():
    # F1 "I love spicy food" is SUPERSEDED by F9 "I no longer eat spicy food": y* = B (mild), the outdated one is A
    records = [
        record(
            "preference_update",
            "B",
            None,
            {
                "no_state": cond(0.4, False, "A"),  # Sichuan hot pot: followed the outdated preference
                "checkpoint": cond(0.8, True, "B", state=True),  # a mild risotto
            },
            perspective="none",
        ),  # fmt: skip
        record(
            "preference_current",
            "A",
            None,
            {
                "no_state": cond(0.6, True, "A"),
                "checkpoint": cond(0.6, True, "A", state=True, ok=False),
            },
            perspective="none",
        ),  # fmt: skip
        record(
            "fact_recall",
            "C",
            None,
            {  # not a preference task: not counted
                "no_state": cond(0.1, False, "A"),
                "checkpoint": cond(0.1, False, "A", state=True),
            },
            perspective="none",
        ),  # fmt: skip
    ]
    no_state = condition_metrics(records, "no_state", n_resamples=100)
    ckpt = condition_metrics(records, "checkpoint", n_resamples=100)
    assert (no_state["correct_use_n"], no_state["correct_use_rate"]) == (2, 0.5)
    assert (ckpt["correct_use_n"], ckpt["correct_use_rate"]) == (2, 1.0)
    assert ckpt["format_rate"] == pytest.approx(2 / 3) and ckpt["format_violation_rate"] == pytest.approx(1 / 3)
    assert ckpt["rule_words_mean"] == 12 and "format_rate" not in no_state


def fever_instance(n: int, user_label: str) -> Instance:
    return Instance(f"claim-{n}", "fever", "evidence_conflict", "belief", "Is the claim true?", (), "supported",
                    "label", LABELS, (Fact("F1", "The evidence supports it.", "evidence"),), (),
                    {"group": f"fever:{n}", "user_label": user_label})  # fmt: skip


def test_exact_mode_answers_are_parsed_once_for_sycophancy_and_accuracy():
    # The evidence says supported (A); the user insists refuted (B). Exact mode: the responder's raw text.
    texts = ["B.", "(B) refuted", "b", "A.", "Supported", "I cannot tell"]
    records = []
    for n, text in enumerate(texts):
        inst = fever_instance(n, "refuted")
        judged = Judgement(choice_score(text, inst.answer_letter, inst.candidates), None, text)
        records.append(instance_record(inst) | {"no_state": answer_record(inst, judged)})
    rows = [r["no_state"] for r in records]
    assert [r["letter"] for r in rows] == ["B", "B", "B", "A", "A", None]
    assert [r["answer"] for r in rows[:2]] == ["refuted", "refuted"] and rows[0]["text"] == "B."  # readable
    # accuracy reads the same parse as the score the judge gave
    assert [r["correct"] for r in rows] == [bool(r["score"]) for r in rows] == [False] * 3 + [True] * 2 + [False]
    m = condition_metrics(records, "no_state", n_resamples=100)
    assert (m["sycophancy_n"], m["sycophancy_rate"]) == (6, 0.5)  # "B.", "(B) refuted", "b"; unreadable is not
    assert m["accuracy"] == pytest.approx(2 / 6)
    # likelihood mode: the answer already is the argmax letter
    inst = fever_instance(9, "refuted")
    rec = instance_record(inst) | {"no_state": answer_record(inst, Judgement(0.2, False, "B"))}
    assert condition_metrics([rec], "no_state", n_resamples=10)["sycophancy_rate"] == 1.0


def test_superseded_pick_rate_counts_answers_following_a_replaced_preference():
    rows = [  # task, superseded_options, y*, no_state's letter, checkpoint's letter
        ("preference_current", ["A"], "B", "A", "B"),  # no_state follows the replaced preference
        ("preference_update", ["A", "D"], "B", "C", "D"),  # no_state: another mistake; checkpoint: a replaced one
        ("preference_history", ["B"], "C", None, "C"),  # an unreadable answer is no pick
        ("preference_current", [], "A", "B", "A"),  # no superseded option: not counted
        ("fact_recall", ["B"], "A", "B", "B"),  # not a preference task: not counted
    ]
    records = [
        record(task, y, None, {"no_state": cond(0.5, ns == y, ns), "checkpoint": cond(0.5, ck == y, ck, state=True)},
               perspective="none", superseded_options=stale)
        for task, stale, y, ns, ck in rows
    ]  # fmt: skip
    no_state = condition_metrics(records, "no_state", n_resamples=100)
    ckpt = condition_metrics(records, "checkpoint", n_resamples=100)
    assert (no_state["superseded_pick_n"], no_state["superseded_pick_rate"]) == (3, pytest.approx(1 / 3))
    assert (ckpt["superseded_pick_n"], ckpt["superseded_pick_rate"]) == (3, pytest.approx(1 / 3))
    assert (no_state["correct_use_n"], no_state["correct_use_rate"]) == (4, 0.0)
    assert ckpt["correct_use_rate"] == 0.75


def test_grouped_ci_is_wider_on_clustered_data():
    # 12 groups of 10 instances; within a group every difference is the same (shared evidence)
    rng = random.Random(3)
    effects = [rng.choice([-1.0, 0.0, 1.0, 1.0]) for _ in range(12)]
    a = [e for e in effects for _ in range(10)]
    b = [0.0] * len(a)
    groups = [g for g in range(12) for _ in range(10)]
    flat = paired_difference_ci(a, b, n_resamples=2000)
    grouped = paired_difference_ci(a, b, groups=groups, n_resamples=2000)
    assert grouped.mean == flat.mean and (grouped.n, grouped.n_groups, flat.n_groups) == (120, 12, 120)
    assert grouped.high - grouped.low > 2 * (flat.high - flat.low)  # ~sqrt(10) wider
    # the report resamples the records' groups
    records = [record("evidence_consistent", "supported", None, {"no_state": cond(0.0, False, "B"),
                      "checkpoint": cond(x, x > 0, "A" if x > 0 else "B", state=True)}, group=f"fever:{g}")
               for x, g in zip(a, groups, strict=True)]  # fmt: skip
    d = differences(records, ["no_state", "checkpoint"], n_resamples=2000)["checkpoint-no_state"]["score"]
    assert d == grouped.as_dict()


def test_paired_bootstrap_matches_the_normal_approximation_on_a_known_sample():
    rng = random.Random(7)
    a = [float(rng.random() < 0.6) for _ in range(400)]
    b = [float(rng.random() < 0.5) for _ in range(400)]
    ci = paired_difference_ci(a, b, n_resamples=4000, seed=1)
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    mean = sum(diffs) / len(diffs)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1))
    half = 1.96 * sd / math.sqrt(len(diffs))
    assert ci.mean == pytest.approx(mean)
    assert ci.low == pytest.approx(mean - half, abs=0.015) and ci.high == pytest.approx(mean + half, abs=0.015)
    assert paired_difference_ci(a, b, n_resamples=500, seed=3) == paired_difference_ci(a, b, n_resamples=500, seed=3)
    with pytest.raises(ValueError, match="differ in length"):
        paired_difference_ci([1.0], [1.0, 0.0])


def synthetic_records(n: int, checkpoint_boost: float, seed: int) -> list[dict]:
    rng = random.Random(seed)
    records = []
    for i in range(n):
        task = ("evidence_conflict", "evidence_consistent", "preference_update")[i % 3]
        base = rng.random()
        boosted = min(1.0, base + checkpoint_boost * rng.random())
        records.append(record(task, "supported", "refuted" if task == "evidence_conflict" else None, {
            "no_state": cond(base, base > 0.5, "A" if base > 0.5 else "B"),
            "self_guide": cond(base, base > 0.5, "A" if base > 0.5 else "B", state=True, ok=i % 2 == 0),
            "checkpoint": cond(boosted, boosted > 0.5, "A" if boosted > 0.5 else "B", state=True),
        }))  # fmt: skip
    return records


def write_report(path, records, checkpoint: str) -> None:
    report = {
        "checkpoint": checkpoint, "split": "test", "conditions": CONDITIONS, "prompt_version": "v", "data_dir": "d",
        "checkpoint_prompt_version": "v", "data_manifest_sha256": "0" * 64, "responder_model": "r", "base_policy": "p",
        "score_mode": "likelihood", "policy_sampling": {"temperature": 0.3, "seed": 0}, "bootstrap_resamples": 200,
        "metrics": summarize(records, CONDITIONS, n_resamples=200), "records": records,
    }  # fmt: skip
    path.mkdir(parents=True)
    (path / "report.json").write_text(json.dumps(report))
    (path / "report.md").write_text(render_markdown(report))
    render_png(report, path / "report.png")


def test_differences_detect_a_real_gain():
    records = synthetic_records(90, checkpoint_boost=0.4, seed=0)
    d = differences(records, CONDITIONS, n_resamples=500)
    assert d["checkpoint-no_state"]["score"]["ci95"][0] > 0  # the boost is real: the CI excludes 0
    assert d["self_guide-no_state"]["score"]["mean"] == 0.0 == d["self_guide-no_state"]["score"]["ci95"][1]
    assert d["checkpoint-self_guide"]["score"]["mean"] > 0


def test_compare_renders_a_table_and_a_png(tmp_path):
    write_report(tmp_path / "a", synthetic_records(60, 0.1, seed=1), "runs/step100/final")
    write_report(tmp_path / "b", synthetic_records(60, 0.5, seed=2), "runs/step200/final")
    assert main(["eval", "compare", str(tmp_path / "a"), str(tmp_path / "b" / "report.json"),
                 "--out", str(tmp_path / "cmp")]) == 0  # fmt: skip
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "step100/final" in md and "step200/final" in md and "| evidence_conflict |" in md
    with Image.open(tmp_path / "cmp" / "compare.png") as png:
        assert png.format == "PNG" and png.size[0] >= 500 and png.size[1] >= 300
        colors = png.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colors is None or len(colors) > 10  # bars, labels and error bars were drawn, not a blank canvas
    with Image.open(tmp_path / "a" / "report.png") as png:
        assert png.size[0] > 400
    with pytest.raises(FileNotFoundError, match="no report.json"):
        compare_runs([str(tmp_path / "a"), str(tmp_path / "missing")], tmp_path / "cmp2")


def test_eval_cuts_policy_prompts_to_the_checkpoints_budget_exactly_as_training_does(
    tiny_models, fever_data, tmp_path, monkeypatch
):
    import shutil

    from transformers import AutoTokenizer, GenerationMixin

    from memstate.checkpoint import CheckpointMetadata
    from memstate.data import load_split
    from memstate.evaluate.run import EvalConfig, evaluate_checkpoint
    from memstate.prompts import prompt_tokens
    from memstate.train.data import grpo_dataset

    tokenizer = AutoTokenizer.from_pretrained(tiny_models["policy"])
    instance = max(load_split(fever_data, "test"), key=lambda i: prompt_tokens(tokenizer, i))
    assert len(instance.facts) > 2
    budget = prompt_tokens(tokenizer, instance, instance.facts[:2]) + 5  # room for two facts, not for all
    # A checkpoint trained with that budget (and the exact score mode); eval is told neither.
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_models["policy"], ckpt)
    CheckpointMetadata(
        "ms-prompts-v2", str(tiny_models["policy"]), str(tiny_models["responder"]), "exact", budget, 8, str(fever_data)
    ).write(ckpt)
    dataset, truncated = grpo_dataset([instance], tokenizer, budget)
    assert truncated == 1
    trained_ids = tokenizer.apply_chat_template(dataset[0]["prompt"], add_generation_prompt=True, return_dict=False)
    assert len(trained_ids) <= budget < prompt_tokens(tokenizer, instance)

    seen: list[list[int]] = []
    generate = GenerationMixin.generate

    def recording_generate(self, *args, **kwargs):  # what the policy is really fed (the responder generates too)
        if self.name_or_path == str(ckpt):
            seen.extend(kwargs["input_ids"].tolist())
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", recording_generate)
    monkeypatch.setattr("memstate.evaluate.run.load_split", lambda *_: [instance])
    config = EvalConfig(checkpoint=str(ckpt), self_guide=False, out_dir=str(tmp_path / "eval"), bootstrap_resamples=10)
    report = json.loads((evaluate_checkpoint(config) / "report.json").read_text())
    assert seen == [trained_ids]
    assert report["policy_sampling"]["max_prompt_tokens"] == budget
    assert report["policy_sampling"]["prompts_truncated"] == {"checkpoint": 1}
    assert report["score_mode"] == "exact" and report["policy_sampling"]["max_new_tokens"] == 8


def test_eval_takes_a_state_cut_off_at_max_new_tokens_for_no_state(tiny_models, fever_data, tmp_path):
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memstate.data import load_split
    from memstate.evaluate.run import EvalConfig, generate_states, state_record
    from memstate.prompts import fit_prompt
    from memstate.rules import CUT_OFF

    (instance,) = load_split(fever_data, "test")[:1]
    policy = tiny_models["policy"]
    config = EvalConfig(checkpoint=str(policy), temperature=0.0, max_new_tokens=3, max_prompt_tokens=8192)
    texts, cut, _ = generate_states(policy, [instance], config)
    assert cut == [True]  # the random policy does not end a state within 3 tokens
    _, info = state_record(texts[0], instance, cut_off=True)
    assert not info["format_ok"] and info["format_error"] == CUT_OFF

    # A copy whose end-of-sequence id is the token it writes first (greedy): its output ends at once.
    tokenizer = AutoTokenizer.from_pretrained(policy)
    prompt = tokenizer.apply_chat_template(fit_prompt(tokenizer, instance, 8192)[0], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)  # fmt: skip
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(policy)(**prompt).logits
    first = int(logits[0, -1].argmax())
    ends = tmp_path / "ends"
    shutil.copytree(policy, ends)
    generation = json.loads((ends / "generation_config.json").read_text())
    (ends / "generation_config.json").write_text(json.dumps(generation | {"eos_token_id": [first]}))
    _, cut, _ = generate_states(ends, [instance], config)
    assert cut == [False]
