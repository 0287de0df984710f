"""``memstate demo``: the main job on the embedded default, as README.md's first command runs it.

Tiny random-init models → the FEVER fixtures as Instances → format warm-up and GRPO on CPU, validated every 50 steps
→ evaluation of the best checkpoint (by validation gain) and of the final one, on the test split. Each stage is the
``memstate`` command the README shows, run in-process and timed; the run ends with ``runs/demo/summary.json`` and
``summary.md``: the reward curve in numbers, the format rates, each checkpoint's validation gain, accuracy and gain of
both checkpoints on the test split, and the durations on this machine.
README.md's demo section is that ``summary.md`` (tests/test_readme.py compares them after a fresh run).

A pipeline exercise: the models know nothing, so accuracy and gain are noise; what the numbers show is that the
stages connect, that GRPO raises the reward (mostly the format rate) and that the checkpoint kept is the best one.
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path

from memstate.cli import main as memstate
from memstate.errors import ConfigError

TRAIN_CONFIG = "configs/train/tiny_cpu.yaml"
DATA_CONFIG = "configs/data/fever_fixture.yaml"
TRAIN_DIR = Path("runs/train/tiny_cpu")
# Sampled as in training, so that the test split's format rate compares with training's (eval's default is the serve
# API's T = 0.3, at which the tiny policy writes nearly the same state for every instance).
EVAL_TEMPERATURE = "1.0"
FIRST_STEPS, LAST_STEPS = 20, 50


def stages() -> list[tuple[str, list[str]]]:
    """The demo's commands, in order: (stage name, memstate arguments)."""
    evals = [
        (f"eval_{which}", ["eval", "--checkpoint", str(TRAIN_DIR / which), "--split", "test",
                           "--temperature", EVAL_TEMPERATURE])
        for which in ("best", "final")
    ]  # fmt: skip
    return [
        ("tiny_models", ["tiny-models", "--out", "runs/tiny-models"]),
        ("build_data", ["build-data", "--config", DATA_CONFIG, "--out", "runs/data/fever_fixture"]),
        ("train", ["train", "--config", TRAIN_CONFIG]),
        *evals,
    ]


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 3) if values else None


def training_summary(log_history: list[dict]) -> dict:
    """The GRPO curve in numbers: reward and format rate over the first and last steps, the peak logged format rate.

    >>> h = [{"step": s, "reward": r, "memstate/format_rate": f, "memstate/cut_off_rate": 0.0}
    ...      for s, r, f in [(10, -0.5, 0.5), (20, -0.3, 0.7), (60, -0.1, 0.9), (70, -0.2, 0.8)]]
    >>> s = training_summary(h)
    >>> s["reward_first_20_steps"], s["reward_last_50_steps"], s["peak_format_rate"], s["peak_format_rate_step"]
    (-0.4, -0.15, 0.9, 60)
    """
    rows = [e for e in log_history if "reward" in e]
    if not rows:
        raise ConfigError("the training log holds no reward: did GRPO run?")
    last = rows[-1]["step"]
    first_rows = [e for e in rows if e["step"] <= FIRST_STEPS]
    last_rows = [e for e in rows if e["step"] > last - LAST_STEPS]
    peak = max(rows, key=lambda e: e["memstate/format_rate"])
    return {
        "grpo_steps": last,
        "logged_every": rows[0]["step"],
        f"reward_first_{FIRST_STEPS}_steps": _mean([e["reward"] for e in first_rows]),
        f"reward_last_{LAST_STEPS}_steps": _mean([e["reward"] for e in last_rows]),
        f"format_rate_first_{FIRST_STEPS}_steps": _mean([e["memstate/format_rate"] for e in first_rows]),
        f"format_rate_last_{LAST_STEPS}_steps": _mean([e["memstate/format_rate"] for e in last_rows]),
        f"cut_off_rate_last_{LAST_STEPS}_steps": _mean([e.get("memstate/cut_off_rate", 0.0) for e in last_rows]),
        "peak_format_rate": round(peak["memstate/format_rate"], 3),
        "peak_format_rate_step": peak["step"],
        "validation_instances": max((e["eval_instances"] for e in log_history if "eval_instances" in e), default=0),
    }


def eval_summary(report: dict) -> dict:
    """Accuracy without and with the checkpoint's states, the gain with its CI, format and leak rates."""
    overall = report["metrics"]["overall"]
    conditions, gain = overall["conditions"], overall["differences"]["checkpoint-no_state"]["score"]
    return {
        "n": overall["n"],
        "accuracy_no_state": round(conditions["no_state"]["accuracy"], 3),
        "accuracy_checkpoint": round(conditions["checkpoint"]["accuracy"], 3),
        "gain": round(gain["mean"], 3),
        "gain_ci95": [round(x, 3) for x in gain["ci95"]],
        "format_rate": round(conditions["checkpoint"]["format_rate"], 3),
        "leak_rate": round(conditions["checkpoint"]["leak_rate"], 3),
    }


def summarize(train_dir: Path, seconds: dict[str, float]) -> dict:
    training = training_summary(json.loads((train_dir / "log_history.json").read_text()))
    best = json.loads((train_dir / "best.json").read_text())
    evals = {
        which: eval_summary(json.loads((train_dir / which / "eval-test" / "report.json").read_text()))
        for which in ("best", "final")
    }
    return {
        "training": training,
        "selected_by": best["selected_by"],
        # each checkpoint's validation gain (eval_gain at its step; train/validation.py), by step
        "validation_gain": {
            step: round(row["validation_gain"], 3)
            for step, row in best["checkpoints"].items()
            if row.get("validation_gain") is not None
        },
        "best_step": best["best"]["step"] if best["best"] else None,
        "best_score": round(best["best"]["score"], 3) if best["best"] else None,
        "final_step": best["final"]["step"],
        "final_score": round(best["final"]["score"], 3) if best["final"]["score"] is not None else None,
        "test": evals,
        # The check the demo is held to: sampled on unseen claims, the kept checkpoint writes well-formed states
        # about as often as training at its best did.
        "best_test_format_rate_minus_peak_training": round(
            evals["best"]["format_rate"] - training["peak_format_rate"], 3
        ),
        "seconds": {k: round(v) for k, v in seconds.items()} | {"total": round(sum(seconds.values()))},
    }


def _ci(ci: list[float]) -> str:
    return f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def render(summary: dict) -> str:
    """summary.md: what README.md's demo section holds."""
    t, best, final = summary["training"], summary["test"]["best"], summary["test"]["final"]
    s = summary["seconds"]
    lines = [
        f"- GRPO, {t['grpo_steps']} steps: mean reward {t['reward_first_20_steps']:+.3f} over the first 20 steps, "
        f"{t['reward_last_50_steps']:+.3f} over the last 50; format rate {t['format_rate_first_20_steps']:.3f} → "
        f"{t['format_rate_last_50_steps']:.3f} (peak {t['peak_format_rate']:.3f} at step "
        f"{t['peak_format_rate_step']}, logged every {t['logged_every']} steps); cut off at the token limit over the "
        f"last 50 steps: {t['cut_off_rate_last_50_steps']:.3f}.",
        f"- Kept checkpoints, chosen by {summary['selected_by'].replace('_', ' ')} (the reward on the "
        f"{t['validation_instances']} validation instances, 4 states each, at every save): "
        + ", ".join(f"step {k} {v:+.3f}" for k, v in summary["validation_gain"].items())
        + f"; best step {summary['best_step']} ({summary['best_score']:+.3f}), final step {summary['final_step']} "
        f"({summary['final_score']:+.3f}).",
        f"- Test split ({best['n']} instances, states sampled at T = {EVAL_TEMPERATURE}): accuracy "
        f"{best['accuracy_no_state']:.3f} without a state; with the best checkpoint's states "
        f"{best['accuracy_checkpoint']:.3f}, gain {best['gain']:+.3f} {_ci(best['gain_ci95'])}, format rate "
        f"{best['format_rate']:.3f}, leak rate {best['leak_rate']:.3f}; with the final one's "
        f"{final['accuracy_checkpoint']:.3f}, gain {final['gain']:+.3f} {_ci(final['gain_ci95'])}, format rate "
        f"{final['format_rate']:.3f}, leak rate {final['leak_rate']:.3f}.",
        f"- Durations on the machine that wrote this: {s['total']} s in all (tiny models {s['tiny_models']} s, data "
        f"{s['build_data']} s, training {s['train']} s, evaluations {s['eval_best']} + {s['eval_final']} s), "
        "not counting `make setup`.",
    ]
    return "\n".join(lines) + "\n"


def make_parser(prog: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="The main job on the embedded default (README's first command): tiny models, FEVER fixtures, "
        "GRPO on CPU, evaluation of the best and the final checkpoint; writes OUT/summary.json and summary.md. "
        "Run it from the repository root (it reads configs/).",
    )
    p.add_argument("--out", default="runs/demo", help="Where summary.json and summary.md go.")
    return p


def run(args: argparse.Namespace) -> int:
    for config in (TRAIN_CONFIG, DATA_CONFIG):
        if not Path(config).is_file():
            raise ConfigError(f"{config}: not found; run memstate demo from the repository root")
    seconds: dict[str, float] = {}
    for name, argv in stages():
        print(f"\n$ memstate {shlex.join(argv)}", flush=True)
        start = time.perf_counter()
        code = memstate(argv)
        seconds[name] = time.perf_counter() - start
        if code:
            return code
    summary = summarize(TRAIN_DIR, seconds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(render(summary))
    print(f"\n{out / 'summary.md'}:\n\n{render(summary)}")
    return 0
