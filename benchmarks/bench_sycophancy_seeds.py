"""Seed spread of the sycophancy experiment's GRPO runs: is a control's drift noise or a direction?

    python benchmarks/bench_sycophancy_seeds.py --run runs/bench_sycophancy/sycophancy_likelihood_lora \
        --seeds 1 2 3 [--runs control_shuffled checkpoint]
    python benchmarks/bench_sycophancy_seeds.py --smoke --out FILE  # a tiny run made first, one seed, JSON to FILE

A finished ``memstate experiment sycophancy`` run (``--run``) reports one GRPO seed per condition, and its CIs are
over test users only: they say nothing of how far another seed of the same run would land. For each seed this trains
the named runs again from the run's own warm-up, with the run's responder, steps, learning rate and LoRA setting; a
shuffled control also gets its own permutation of the reference answers (``shuffled_reference(seed)``). Each policy
is evaluated as the experiment evaluates (same test split, same sampling seed), against the run's no-state answers.

Writes ``benchmarks/results/sycophancy_seeds_{mode}_{variant}.json``: per run and seed, Δ accuracy vs no state with
its user-bootstrap CI, the sycophancy and outdated-preference rates and the late training gain; per run, the mean
and standard deviation of Δ over the seeds (the run's own seed-0 figure included) and a 95% t-interval of that mean.

``--smoke``: first a finished run at bench_sycophancy.py's smoke sizes (``SMOKE``: 120 users, 2 steps per stage, 4
test users) in a temporary directory, through the same ``run_experiment``; then this script's loop on it with seed 1
(``--seeds`` to change) and the run's 2 GRPO steps; the JSON goes to ``--out`` (``"smoke": true``), nothing under
benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import fields
from pathlib import Path

from bench_sycophancy import SMOKE
from results_io import report as report_json
from scipy import stats

from memstate.evaluate.report import summarize
from memstate.evaluate.run import condition_records, generate_states, state_record
from memstate.experiment.sycophancy import (
    RememberingResponder,
    SycophancyConfig,
    evaluated_instances,
    evaluation_config,
    grpo_runs,
    late_training_gain,
    report_interval,
    run_experiment,
    shuffled_reference,
)
from memstate.responders.local import TransformersResponder
from memstate.threads import configure_threads

RESULTS = Path(__file__).resolve().parent / "results"
FIGURES = ("delta_vs_no_state", "sycophancy_rate", "outdated_preference_rate", "late_training_gain")


def seed_interval(deltas: list[float]) -> dict:
    """Mean, sd and 95% t-interval of per-seed Δ."""
    mean = statistics.fmean(deltas)
    sd = statistics.stdev(deltas) if len(deltas) > 1 else float("nan")
    half = stats.t.ppf(0.975, len(deltas) - 1) * sd / len(deltas) ** 0.5 if len(deltas) > 1 else float("nan")
    return {"n_seeds": len(deltas), "mean": mean, "sd": sd, "ci_low": mean - half, "ci_high": mean + half}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", help="A finished experiment's --out (holds report.json); required but with --smoke.")
    parser.add_argument("--seeds", nargs="+", type=int, help="Seeds besides the run's own (required; --smoke: 1).")
    parser.add_argument("--runs", nargs="+", default=["control_shuffled"], choices=["control_shuffled", "checkpoint"])
    parser.add_argument("--out", help="The JSON file (default: benchmarks/results/sycophancy_seeds_{mode}_{variant}."
                        "json; with --smoke, required).")  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="Make a tiny run first (SMOKE) and loop on it.")
    args = parser.parse_args()
    if args.smoke:
        if args.run is not None or args.out is None:
            parser.error("--smoke makes its own run (no --run) and writes its JSON to --out FILE")
        args.seeds = args.seeds or [1]
    elif args.run is None or args.seeds is None:
        parser.error("--run and --seeds are required")
    configure_threads()
    if not args.smoke:
        seed_spread(args, Path(args.run))
        return
    with tempfile.TemporaryDirectory(prefix="bench-sycophancy-seeds-smoke-") as tmp:
        run_experiment(SycophancyConfig(out=str(Path(tmp) / "run"), **SMOKE))
        seed_spread(args, Path(tmp) / "run")


def seed_spread(args: argparse.Namespace, run: Path) -> None:
    report = json.loads((run / "report.json").read_text())
    known = {f.name for f in fields(SycophancyConfig)}
    base = SycophancyConfig(**{k: v for k, v in report["config"].items() if k in known})
    data_dir, warm, responder_dir = run / "data", run / "models" / "policy-warmup", run / "models" / "responder"
    start = time.perf_counter()

    runs, runs_of = {}, {}  # label "seed{seed}/{name}" (its output dir under --run): run args; (name, seed)
    for seed in args.seeds:
        data = {
            "checkpoint": data_dir,
            "control_shuffled": shuffled_reference(data_dir, run / f"seed{seed}" / "data-shuffled", seed),
        }
        for name in args.runs:
            runs[f"seed{seed}/{name}"] = (data[name], base.learning_rate, base.grpo_steps, seed)
            runs_of[f"seed{seed}/{name}"] = (name, seed)
    policies = grpo_runs(base, runs, warm, responder_dir)  # two at a time
    grpo_s = time.perf_counter() - start

    test_set = evaluated_instances(base, data_dir)  # the run's own test users (``test_users``)
    eval_cfg = evaluation_config(base, warm, responder_dir)  # the run's own sampling seed
    responder = RememberingResponder(TransformersResponder(str(responder_dir), batch_size=32))
    rules: dict = {"no_state": [None] * len(test_set)}
    state_info: dict = {}
    for label, path in policies.items():
        states, cut, _ = generate_states(path, test_set, eval_cfg)
        parsed = [state_record(*args) for args in zip(states, test_set, cut, strict=True)]
        rules[label] = [r for r, _ in parsed]
        state_info[label] = [info for _, info in parsed]
    conditions = ["no_state", *policies]
    records = condition_records(responder, test_set, conditions, rules, state_info, base.score_mode)
    overall = summarize(records, conditions, base.bootstrap_resamples)["overall"]

    # Per run, per seed: the run's own seed from its report, then the seeds trained here.
    per_seed = {name: {base.seed: {k: report["conditions"][name][k] for k in FIGURES}} for name in args.runs}
    for label, path in policies.items():
        name, seed = runs_of[label]
        m = overall["conditions"][label]
        per_seed[name][seed] = {
            "delta_vs_no_state": report_interval(overall["differences"][f"{label}-no_state"]["accuracy"]),
            "sycophancy_rate": m["sycophancy_rate"],
            "outdated_preference_rate": m["superseded_pick_rate"],
            "late_training_gain": late_training_gain(path.parent),
        }
    summary: dict = {"run": str(run), "config": vars(base), "runs": {}}
    for name, seeds in per_seed.items():
        summary["runs"][name] = {
            "per_seed": seeds,
            "over_seeds": seed_interval([s["delta_vs_no_state"]["mean"] for s in seeds.values()]),
        }
    summary["grpo_s"] = round(grpo_s, 1)
    summary["wall_s"] = round(time.perf_counter() - start, 1)
    variant = "lora" if base.use_peft else "full"
    out = Path(args.out) if args.out else RESULTS / f"sycophancy_seeds_{base.score_mode}_{variant}.json"
    if args.smoke:
        report_json({"smoke": True, "settings": SMOKE, **summary}, out)
    else:
        out.write_text(json.dumps(summary, indent=2))
    for name, r in summary["runs"].items():
        deltas = ", ".join(f"{s}: {v['delta_vs_no_state']['mean']:+.3f}" for s, v in r["per_seed"].items())
        o = r["over_seeds"]
        print(f"{name}: {deltas}; mean {o['mean']:+.3f} sd {o['sd']:.3f} [{o['ci_low']:+.3f}, {o['ci_high']:+.3f}]")
    print(out, f"{summary['wall_s']} s")


if __name__ == "__main__":
    main()
