"""`memstate experiment sycophancy`: the whole method on CPU (synthetic world, trained responder, GRPO, controls)."""

import json

import pytest
from memstate.experiment.sycophancy import late_training_gain

from memstate.cli import main

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
