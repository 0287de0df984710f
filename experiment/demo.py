"""``memstate demo``: the method, as README.md's first command runs it.

The sycophancy world (docs/sycophancy.md) through the public commands: ``build-data`` on its generated users, ``train``
(GRPO with the counterfactual reward, validated every 25 steps) from the shipped warmed-up policy against the shipped
frozen responder (``examples/sycophancy_world/``, built by ``memstate experiment world``), ``eval`` of the best
checkpoint on the test split's unseen users: no state vs self-guide (the policy before GRPO) vs the checkpoint, with
paired cluster-bootstrap CIs. Each stage is the ``memstate`` command the README shows, run in-process and timed; the
run ends with ``runs/demo/summary.json`` and ``summary.md``, which is README.md's demo section (tests/test_readme.py
compares them after a fresh run).

``--pipeline``: the earlier exercise instead, tiny random-init models on the FEVER fixtures (every stage connects,
GRPO raises the reward, mostly the format rate; the models know nothing, so accuracy and gain are noise).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from memstate.cli import main as memstate
from memstate.errors import ConfigError
from memstate.experiment.world_models import check_world

WORLD_FILE = Path("examples/sycophancy_world/world.json")
# States sampled as in training (GRPO samples at 1.0): at the serve API's 0.3 the warmed-up policy would collapse onto
# one arbitrary mode of its uniform mix of rules, and self-guide would measure that mode.
EVAL_TEMPERATURE = "1.0"
FIRST_STEPS, LAST_STEPS = 20, 50


@dataclass(frozen=True)
class Demo:
    name: str
    data_config: str
    data_dir: str
    train_config: str
    train_dir: Path
    evaluated: tuple[str, ...]  # checkpoints evaluated on the test split
    tiny_models: bool = False  # build the tiny random-init models first

    def stages(self) -> list[tuple[str, list[str]]]:
        """The demo's commands, in order: (stage name, memstate arguments)."""
        evals = [
            (f"eval_{which}", ["eval", "--checkpoint", str(self.train_dir / which), "--split", "test",
                               "--temperature", EVAL_TEMPERATURE, "--batch_size", "64"])
            for which in self.evaluated
        ]  # fmt: skip
        return [
            *([("tiny_models", ["tiny-models", "--out", "runs/tiny-models"])] if self.tiny_models else []),
            ("build_data", ["build-data", "--config", self.data_config, "--out", self.data_dir]),
            ("train", ["train", "--config", self.train_config]),
            *evals,
        ]


WORLD = Demo("sycophancy world", "configs/data/synthetic.yaml", "runs/data/synthetic",
             "configs/train/sycophancy_cpu.yaml", Path("runs/train/sycophancy_cpu"), ("best",))  # fmt: skip
PIPELINE = Demo("pipeline exercise", "configs/data/fever_fixture.yaml", "runs/data/fever_fixture",
                "configs/train/tiny_cpu.yaml", Path("runs/train/tiny_cpu"), ("best", "final"),
                tiny_models=True)  # fmt: skip


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


def _interval(d: dict) -> tuple[float, list[float]]:
    return round(d["mean"], 3), [round(x, 3) for x in d["ci95"]]


def eval_summary(report: dict) -> dict:
    """Accuracy per condition, the checkpoint's accuracy gain over no state (and over self-guide) with paired
    cluster-bootstrap CIs, its format, leak and sycophancy rates."""
    overall = report["metrics"]["overall"]
    conditions, differences = overall["conditions"], overall["differences"]
    out = {"n": overall["n"]}
    for cond in ("no_state", "self_guide", "checkpoint"):
        if cond in conditions:
            out[f"accuracy_{cond}"] = round(conditions[cond]["accuracy"], 3)
            rate = conditions[cond]["sycophancy_rate"]
            out[f"sycophancy_rate_{cond}"] = None if rate is None else round(rate, 3)
            out[f"sycophancy_n_{cond}"] = conditions[cond]["sycophancy_n"]  # its sample size (tests/test_readme.py)
    out["gain"], out["gain_ci95"] = _interval(differences["checkpoint-no_state"]["accuracy"])
    if "checkpoint-self_guide" in differences:
        out["gain_vs_self_guide"], out["gain_vs_self_guide_ci95"] = _interval(
            differences["checkpoint-self_guide"]["accuracy"]
        )
    out["format_rate"] = round(conditions["checkpoint"]["format_rate"], 3)
    out["leak_rate"] = round(conditions["checkpoint"]["leak_rate"], 3)
    return out


def summarize(demo: Demo, seconds: dict[str, float]) -> dict:
    train_dir = demo.train_dir
    training = training_summary(json.loads((train_dir / "log_history.json").read_text()))
    best = json.loads((train_dir / "best.json").read_text())
    evals = {
        which: eval_summary(json.loads((train_dir / which / "eval-test" / "report.json").read_text()))
        for which in demo.evaluated
    }
    return {
        "demo": demo.name,
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
        # Sampled on unseen instances, the kept checkpoint writes well-formed states about as often as training at
        # its best did.
        "best_test_format_rate_minus_peak_training": round(
            evals["best"]["format_rate"] - training["peak_format_rate"], 3
        ),
        "seconds": {k: round(v) for k, v in seconds.items()} | {"total": round(sum(seconds.values()))},
    }


def _ci(ci: list[float]) -> str:
    return f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def _rates(e: dict) -> str:
    """Sycophancy (the answer follows a user's wrong belief) per condition, where the data has such instances."""
    rates = {c: e.get(f"sycophancy_rate_{c}") for c in ("no_state", "self_guide", "checkpoint")}
    if rates["checkpoint"] is None:
        return ""
    return "; sycophancy " + " → ".join(f"{rates[c]:.3f}" for c in rates if rates[c] is not None)


def render(summary: dict) -> str:
    """summary.md: what README.md's demo section holds."""
    t, best, s = summary["training"], summary["test"]["best"], summary["seconds"]
    self_guide = (
        f", with self-guide's (the policy before GRPO) {best['accuracy_self_guide']:.3f}"
        if "accuracy_self_guide" in best
        else ""
    )
    versus = (
        f"; over self-guide {best['gain_vs_self_guide']:+.3f} {_ci(best['gain_vs_self_guide_ci95'])}"
        if "gain_vs_self_guide" in best
        else ""
    )
    lines = [
        f"- GRPO, {t['grpo_steps']} steps: mean reward {t['reward_first_20_steps']:+.3f} over the first 20 steps, "
        f"{t['reward_last_50_steps']:+.3f} over the last 50; format rate {t['format_rate_first_20_steps']:.3f} → "
        f"{t['format_rate_last_50_steps']:.3f} (peak {t['peak_format_rate']:.3f} at step "
        f"{t['peak_format_rate_step']}, logged every {t['logged_every']} steps); cut off at the token limit over the "
        f"last 50 steps: {t['cut_off_rate_last_50_steps']:.3f}.",
        f"- Kept checkpoints, chosen by {summary['selected_by'].replace('_', ' ')} (the reward's gain on "
        f"{t['validation_instances']} validation instances at every save): "
        + ", ".join(f"step {k} {v:+.3f}" for k, v in summary["validation_gain"].items())
        + f"; best step {summary['best_step']} ({summary['best_score']:+.3f}), final step {summary['final_step']} "
        f"({summary['final_score']:+.3f}).",
        f"- Test split ({best['n']} instances, states sampled at T = {EVAL_TEMPERATURE}): accuracy "
        f"{best['accuracy_no_state']:.3f} without a state{self_guide}, with the best checkpoint's "
        f"{best['accuracy_checkpoint']:.3f}: gain over no state {best['gain']:+.3f} {_ci(best['gain_ci95'])}"
        f"{versus} (95% CIs, paired bootstrap over users); format rate {best['format_rate']:.3f}, leak rate "
        f"{best['leak_rate']:.3f}{_rates(best)}.",
    ]
    if "final" in summary["test"]:
        final = summary["test"]["final"]
        lines.append(
            f"- The final checkpoint: accuracy {final['accuracy_checkpoint']:.3f}, gain {final['gain']:+.3f} "
            f"{_ci(final['gain_ci95'])}, format rate {final['format_rate']:.3f}, leak rate {final['leak_rate']:.3f}."
        )
    stages = ", ".join(f"{k.replace('_', ' ')} {v} s" for k, v in s.items() if k != "total")
    lines.append(
        f"- Durations on the machine that wrote this: {s['total']} s in all ({stages}), not counting `make setup`."
    )
    return "\n".join(lines) + "\n"


def make_parser(prog: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="The method on the sycophancy world (README's first command): build-data, GRPO training against "
        "the shipped frozen responder, evaluation of the best checkpoint on unseen users (no state, self-guide, "
        "checkpoint); writes OUT/summary.json and summary.md. Run it from the repository root (it reads configs/).",
    )
    p.add_argument("--out", default="runs/demo", help="Where summary.json and summary.md go.")
    p.add_argument(
        "--pipeline",
        action="store_true",
        help="The pipeline exercise instead: tiny random-init models on the FEVER fixtures (accuracy is noise).",
    )
    return p


def run(args: argparse.Namespace) -> int:
    demo = PIPELINE if args.pipeline else WORLD
    for config in (demo.train_config, demo.data_config, *([] if args.pipeline else [WORLD_FILE])):
        if not Path(config).is_file():
            raise ConfigError(f"{config}: not found; run memstate demo from the repository root")
    seconds: dict[str, float] = {}
    for name, argv in demo.stages():
        if name == "train" and demo.train_dir.is_dir():
            # The demo is rerun whole; `memstate train` refuses to start over a run's checkpoints.
            print(f"\nremoving the previous demo run {demo.train_dir}", flush=True)
            shutil.rmtree(demo.train_dir)
        print(f"\n$ memstate {shlex.join(argv)}", flush=True)
        start = time.perf_counter()
        code = memstate(argv)
        if not code and name == "build_data" and demo is WORLD:
            check_world(WORLD_FILE.parent, Path(demo.data_dir))
        seconds[name] = time.perf_counter() - start
        if code:
            return code
    summary = summarize(demo, seconds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(render(summary))
    print(f"\n{out / 'summary.md'}:\n\n{render(summary)}")
    return 0
