"""The whole CLI path on the embedded default: tiny models → data → GRPO (+ resume) → evaluation."""

import json
from pathlib import Path

import pandas as pd
import pytest

from memstate.cli import main
from memstate.prompts import PROMPT_VERSION

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipeline")
    assert main(["tiny-models", "--out", str(tmp / "models")]) == 0
    assert (
        main(["build-data", "--config", str(ROOT / "configs/data/fever_fixture.yaml"), "--out", str(tmp / "data")]) == 0
    )
    common = [
        "--config", str(ROOT / "configs/train/tiny_cpu.yaml"),
        "--policy_model", str(tmp / "models/policy"),
        "--responder_model", str(tmp / "models/responder"),
        "--data_dir", str(tmp / "data"),
        "--output_dir", str(tmp / "run"),
        "--format_warmup_steps", "2",
        "--save_steps", "2",
        "--eval_steps", "2",
        "--logging_steps", "1",
        "--max_completion_length", "16",
    ]  # fmt: skip
    assert main(["train", *common, "--max_steps", "4"]) == 0
    return tmp, common


def test_train_writes_checkpoints_with_metadata(trained):
    tmp, _ = trained
    run = tmp / "run"
    for ckpt in ("checkpoint-2", "checkpoint-4", "final"):
        meta = json.loads((run / ckpt / "memstate.json").read_text())
        assert meta["prompt_version"] == PROMPT_VERSION
        assert meta["grpo_config"]["num_generations"] == 4
        assert meta["data_manifest_sha256"] and meta["responder_model"].endswith("responder")
        for f in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"):
            assert (run / ckpt / f).is_file(), f"{ckpt}/{f} missing"
    history = json.loads((run / "log_history.json").read_text())
    assert [e["step"] for e in history if "reward" in e] == [1, 2, 3, 4]
    assert all("memstate/format_rate" in e for e in history if "reward" in e)
    # validation at every eval_steps (2): TRL's eval_* and memstate's figures over the whole validation split
    validated = [e for e in history if "eval_gain" in e]
    assert [e["step"] for e in validated] == [2, 4] and [e["step"] for e in history if "eval_reward" in e] == [2, 4]
    for e in validated:
        assert e["eval_instances"] == 18 and e["eval_completions"] == 72  # 18 validation instances x 4 states
        assert e["eval_gain_ci_low"] <= e["eval_gain"] <= e["eval_gain_ci_high"]
        assert {"eval_accuracy_no_state", "eval_format_rate", "eval_leak_rate", "eval_cut_off_rate"} <= e.keys()
    assert validated[0]["eval_responder_prompts"] >= 18  # the baselines once, then only with-state prompts
    assert sorted(p.name for p in (run / "audit" / "validation").iterdir()) == [
        "step-000002-rank0.parquet", "step-000004-rank0.parquet"]  # fmt: skip
    assert set(json.loads((run / "timings.json").read_text())) >= {"load_data", "format_warmup", "grpo"}
    # tracking: wandb's offline run directory and the curves, next to the checkpoints
    assert list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    png = (run / "training_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    card = (run / "final" / "README.md").read_text()
    assert "GRPO steps logged: 4" in card and PROMPT_VERSION in card
    assert json.loads((run / "reward_stats.json").read_text())["responder_prompts"] > 0
    # the default shared-prefix path (split attention on CPU) passed its first-use check and encoded each group's
    # prompt once
    shared_prefix = json.loads((run / "shared_prefix.json").read_text())
    assert shared_prefix == {"enabled": True, "active": True, "off_because": None, "attention": "split"}
    assert all(e["shared_prefix/token_ratio"] > 2 for e in history if "reward" in e)


def test_the_best_checkpoint_by_validation_gain_is_exported_next_to_final(trained):
    from safetensors.torch import load_file

    from memstate.train.best import window_mean

    tmp, _ = trained
    run = tmp / "run"
    history = json.loads((run / "log_history.json").read_text())
    best = json.loads((run / "best.json").read_text())
    assert best["selected_by"] == "validation_gain"
    gains = {e["step"]: e["eval_gain"] for e in history if "eval_gain" in e}
    scores = {int(k): v for k, v in best["scores"].items()}
    assert scores == gains == {2: gains[2], 4: gains[4]}
    # every checkpoint's validation figures next to its training reward
    for step in (2, 4):
        row = best["checkpoints"][str(step)]
        assert row["train_reward"] == window_mean(history, step - 1, step) and row["validation_gain"] == gains[step]
    top = max(scores.values())
    assert best["best"]["score"] == top and best["final"] == {"step": 4, "score": scores[4], "path": str(run / "final")}
    # the earliest checkpoint with the top score (a later tie does not replace it; the final one is kept as best
    # only when it scores higher than every saved one)
    step = min(s for s, v in scores.items() if v == top)
    assert best["best"]["step"] == step
    source = run / ("final" if step == 4 else f"checkpoint-{step}")
    assert best["best"]["source"] == str(source)
    exported, original = load_file(run / "best" / "model.safetensors"), load_file(source / "model.safetensors")
    assert exported.keys() == original.keys() and all(exported[k].equal(original[k]) for k in exported)
    for f in ("config.json", "tokenizer.json", "chat_template.jinja", "memstate.json", "README.md"):
        assert (run / "best" / f).is_file(), f"best/{f} missing"
    assert not list((run / "best").glob("optimizer*")) and not (run / "best" / "trainer_state.json").exists()
    assert f"validation gain: step {step} of 4" in (run / "best" / "README.md").read_text()


def test_validation_chooses_an_earlier_checkpoint_than_the_one_training_reward_would(trained, tmp_path):
    """A run whose validation gain peaks at step 2 while its training reward keeps rising: best/ holds checkpoint-2's
    weights; without validation the same run's best/ would be the final model."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer, TrainerControl, TrainerState, TrainingArguments

    from memstate.checkpoint import CheckpointMetadata
    from memstate.train.best import BestCheckpointCallback
    from memstate.train.run import export_best

    tmp, _ = trained
    run = tmp_path / "run"
    shutil.copytree(tmp / "run" / "final", run / "final")
    for step in (2, 4, 6):  # distinct weights per checkpoint, so best/ shows which one it came from
        target = run / ("final" if step == 6 else f"checkpoint-{step}")
        if step != 6:
            shutil.copytree(tmp / "run" / "final", target)
        weights = load_file(target / "model.safetensors")
        shifted = {k: v + step if v.is_floating_point() else v for k, v in weights.items()}
        save_file(shifted, target / "model.safetensors")
    args = TrainingArguments(output_dir=str(run), save_steps=2, max_steps=6, report_to=[], use_cpu=True)
    curves = {2: (-0.8, 0.30), 4: (-0.5, 0.10), 6: (-0.2, 0.05)}  # training reward up, validation gain down
    chosen = {}
    for by_validation in (True, False):
        state, callback = TrainerState(), BestCheckpointCallback(by_validation)
        for step, (reward, gain) in curves.items():
            state.log_history += [{"step": step - 1, "reward": reward}, {"step": step, "reward": reward},
                                  {"step": step, "eval_gain": gain}]  # fmt: skip
            state.global_step = step
            if step < 6:
                callback.on_save(args, state, TrainerControl())
        metadata = CheckpointMetadata.read(run / "final")
        tokenizer = AutoTokenizer.from_pretrained(run / "final")
        report = export_best(state, args, "unused", run / "final", tokenizer, metadata, torch.float32, by_validation)
        chosen[by_validation] = (report["selected_by"], report["best"]["step"])
        exported = load_file(run / "best" / "model.safetensors")
        source = load_file(Path(report["best"]["source"]) / "model.safetensors")
        assert all(exported[k].equal(source[k]) for k in exported)
        if by_validation:
            assert report["best"]["source"] == str(run / "checkpoint-2")
            assert report["checkpoints"]["4"] == {"train_reward": -0.5, "validation_gain": 0.10}
    assert chosen == {True: ("validation_gain", 2), False: ("train_reward", 6)}


def test_resume_continues_from_last_checkpoint(trained):
    tmp, common = trained
    run = tmp / "run"
    # Mark the saved trainer state: a resumed run carries it on; a run that restarted would not have it.
    state_file = run / "checkpoint-4" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["log_history"][0]["resume_marker"] = 1
    state_file.write_text(json.dumps(state))
    assert main(["train", *common, "--max_steps", "6", "--resume"]) == 0
    history = json.loads((run / "log_history.json").read_text())
    assert history[0].get("resume_marker") == 1
    assert [e["step"] for e in history if "reward" in e] == [1, 2, 3, 4, 5, 6]
    assert (run / "checkpoint-6" / "memstate.json").is_file()
    # Checkpoint rotation (save_total_limit 2) keeps the latest and the best; the resumed run knew the best so far.
    best = json.loads((run / "best.json").read_text())
    scores = {int(k): v for k, v in best["scores"].items()}
    assert set(scores) == {2, 4, 6}
    assert best["best"]["step"] == min(s for s, v in scores.items() if v == max(scores.values()))
    kept = sorted(int(p.name.split("-")[1]) for p in run.glob("checkpoint-*"))
    assert 6 in kept and len(kept) <= 2
    if best["best"]["step"] != 6:
        assert best["best"]["step"] in kept, (best, kept)


def _copy_of_the_run(trained, tmp_path) -> tuple[Path, list[str]]:
    """The trained run copied (the module's run stays as it is), and the train arguments pointing at the copy."""
    import shutil

    tmp, common = trained
    run = tmp_path / "run"
    shutil.copytree(tmp / "run", run)
    return run, [str(run) if a == str(tmp / "run") else a for a in common]


def test_the_first_day_resume_rules(trained, tmp_path, capsys, caplog):
    """A save cut off mid-write is set aside and --resume auto continues from the newest complete checkpoint; a
    fresh start over checkpoints is refused; a DeepSpeed checkpoint of another world size is refused by the dry run
    before anything loads, in one line with the fix."""
    run, common = _copy_of_the_run(trained, tmp_path)
    kept = sorted(int(p.name.split("-")[1]) for p in run.glob("checkpoint-*"))
    last, cut = kept[-1], kept[-1] + 2
    assert json.loads((run / f"checkpoint-{last}" / "memstate.json").read_text())["world_size"] == 1
    # Starting over a run's checkpoints without --resume would overwrite them: refused, in one line.
    assert main(["train", *common, "--max_steps", str(cut)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"holds {len(kept)} checkpoint(s)" in err[0] and "--resume" in err[0], err
    # The job killed while saving step `cut`: weights written, trainer_state.json (the Trainer's last file) not.
    broken = run / f"checkpoint-{cut}"
    broken.mkdir()
    (broken / "model.safetensors").write_bytes(b"cut off")
    assert main(["train", *common, "--max_steps", str(cut), "--dry-run", "--resume", "auto"]) == 0
    assert f"from {run / f'checkpoint-{last}'}, saved by 1 processes" in capsys.readouterr().out
    assert broken.is_dir(), "the dry run sets nothing aside"
    with caplog.at_level("WARNING", logger="memstate.train"):
        assert main(["train", *common, "--max_steps", str(cut), "--resume", "auto"]) == 0
    assert any(f"checkpoint-{cut}: an incomplete save" in r.getMessage() for r in caplog.records)
    assert (run / f"incomplete-checkpoint-{cut}" / "model.safetensors").read_bytes() == b"cut off"
    assert (run / f"checkpoint-{cut}" / "trainer_state.json").is_file()  # the resumed run saved that step itself
    history = json.loads((run / "log_history.json").read_text())
    assert [e["step"] for e in history if "reward" in e] == list(range(1, cut + 1))
    # Saved under ZeRO-3 by 16 processes, resumed on 8: refused by the dry run the launch scripts run first.
    meta_file = run / f"checkpoint-{cut}" / "memstate.json"
    meta_file.write_text(json.dumps(json.loads(meta_file.read_text()) | {"world_size": 16, "zero_stage": 3}))
    dry = ["train", *common, "--max_steps", str(cut + 2), "--dry-run", "--resume", "auto"]
    capsys.readouterr()
    assert main([*dry, "--world-size", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "saved by 16 processes under DeepSpeed ZeRO-3, this launch has 8" in err[0], err
    assert f"--policy_model {run / f'checkpoint-{cut}'} --output_dir" in err[0]
    assert main([*dry, "--world-size", "16"]) == 0
    # A fresh output_dir: --resume auto starts fresh, --resume alone is an error.
    fresh = [str(tmp_path / "new") if a == str(run) else a for a in common]
    capsys.readouterr()
    assert main(["train", *fresh, "--max_steps", "1", "--dry-run", "--resume", "auto"]) == 0
    assert "fresh start (--resume auto: no complete checkpoint)" in capsys.readouterr().out


def test_resume_without_checkpoint_is_a_clear_error(trained, tmp_path, capsys):
    _, common = trained
    args = [a if a != str(trained[0] / "run") else str(tmp_path / "empty") for a in common]
    assert main(["train", *args, "--max_steps", "2", "--resume"]) == 2
    assert "no complete checkpoint-" in capsys.readouterr().err


def test_eval_runs_every_condition_and_writes_three_reports(trained):
    tmp, _ = trained
    out = tmp / "eval"
    argv = ["eval", "--checkpoint", str(tmp / "run"), "--split", "test", "--out", str(out), "--max-new-tokens", "16",
            "--self-recheck", "--bootstrap-resamples", "200"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    n_test = sum(1 for _ in open(tmp / "data" / "test.jsonl"))
    assert report["conditions"] == ["no_state", "self_guide", "checkpoint", "self_recheck"]
    assert report["prompt_version"] == PROMPT_VERSION and report["checkpoint"].endswith("best")  # a run dir: its best/
    assert report["base_policy"] == str(json.loads((tmp / "run/final/memstate.json").read_text())["policy_model"])
    overall = report["metrics"]["overall"]
    assert overall["n"] == n_test == len(report["records"])
    for cond in report["conditions"]:
        m = overall["conditions"][cond]
        assert m["accuracy"] is not None and m["responder_tokens_mean"] > 0
        assert m["sycophancy_n"] == sum(r["task"] == "evidence_conflict" for r in report["records"])
    assert overall["conditions"]["checkpoint"]["format_rate"] is not None
    assert set(overall["differences"]) == {"self_guide-no_state", "checkpoint-no_state", "self_recheck-no_state",
                                           "checkpoint-self_guide"}  # fmt: skip
    gain = overall["differences"]["checkpoint-no_state"]["score"]
    assert gain["ci95"][0] <= gain["mean"] <= gain["ci95"][1]
    for rec in report["records"]:
        assert 0.0 <= rec["no_state"]["score"] <= 1.0
        # an unusable state means the instance is answered without rules: same prompt, same score as no state
        if not rec["checkpoint"]["format_ok"]:
            assert rec["checkpoint"]["score"] == pytest.approx(rec["no_state"]["score"])
            assert rec["checkpoint"]["tokens"] == rec["no_state"]["tokens"]
        else:
            assert rec["checkpoint"]["tokens"] > rec["no_state"]["tokens"]
        assert rec["self_recheck"]["tokens"] > rec["no_state"]["tokens"]
    md = (out / "report.md").read_text()
    assert "| self_recheck |" in md and "checkpoint-self_guide" in md and "## By task" in md
    from PIL import Image

    with Image.open(out / "report.png") as png:
        assert png.size[0] > 400 and png.size[1] > 200


def test_a_stop_file_ends_the_run_with_a_checkpoint_and_resume_finishes_it(trained, tmp_path, capsys):
    """What the SLURM script does before the time limit: the file appears, the run saves a checkpoint after the
    current step and exits 2 in one line; --resume continues. The completions table stays at its bounded size."""
    tmp, common = trained
    stop, run = tmp_path / "stop-requested", tmp_path / "run"
    args = [*common, "--output_dir", str(run), "--stop_file", str(stop), "--format_warmup_steps", "0",
            "--save_steps", "100", "--log_completions", "true", "--log_completions_max_rows", "4"]  # fmt: skip
    stop.touch()
    assert main(["train", *args, "--max_steps", "5"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "stopped on request" in last and "after step 1" in last and "--resume" in last, last
    assert (run / "checkpoint-1" / "memstate.json").is_file() and not (run / "final").exists()
    assert json.loads((run / "stopped.json").read_text())["step"] == 1
    # TRL would log the whole round (8 completions here); the bound keeps the last 4 (one group of 4).
    assert len(pd.read_parquet(run / "completions" / "completions_00001.parquet")) == 4
    stop.unlink()
    assert main(["train", *args, "--max_steps", "3", "--resume"]) == 0
    history = json.loads((run / "log_history.json").read_text())
    assert [e["step"] for e in history if "reward" in e] == [1, 2, 3]
    assert (run / "final" / "memstate.json").is_file() and not (run / "stopped.json").exists()
