"""Run `memstate experiment sycophancy` for score modes × (full, LoRA) and keep the figures.

    python benchmarks/bench_sycophancy.py [--quick] [--modes likelihood exact] [--variants full lora]
    python benchmarks/bench_sycophancy.py --smoke --out FILE  # the same runs at a tiny size, JSON to FILE

Each run's summary (per condition accuracy, Δ vs no state with its 95% CI, sycophancy and outdated-preference rates;
checkpoint − self-guide; the criteria; the responder's measured behaviour; stage timings and wall time) goes to
``benchmarks/results/sycophancy_{mode}_{variant}[_quick][_TAG].json``, led by the command, time and load. Every run
after the first starts from a copy of the first run's data, responder and warmed-up policy (none depends on the
score mode or on LoRA; rebuilding them would reproduce the same files in ~14.5 min), and its summary says so
(``shared_stages_from``; its ``timings_s`` then show those stages as reused).

``--smoke``: the same code (every stage: data, responder, warm-up, GRPO, evaluation) at ``SMOKE``'s sizes (120
users, 2 responder, warm-up and GRPO steps, 4 test users), one run (``likelihood``, ``full``) unless ``--modes`` or
``--variants`` name more (a second run also copies the shared stages); the runs go to a temporary directory and the
summaries to ``--out`` (a JSON file, ``"smoke": true``), none under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from results_io import report as report_json

from memstate.experiment.sycophancy import SycophancyConfig, run_experiment
from memstate.threads import configure_threads

RESULTS = Path(__file__).resolve().parent / "results"
# What neither the score mode nor LoRA changes (``run_experiment`` reuses a stage whose output exists).
SHARED_STAGES = ("data", "models/policy-init", "models/responder-init", "models/responder", "models/policy-warmup")
# A smoke run's sizes (``SycophancyConfig`` fields): the fewest users whose build passes the data's shortcut probes
# (fewer fail them), a few steps per stage, the evaluation on 4 test users. bench_sycophancy_seeds.py uses them too.
SMOKE = {"users": 120, "responder_steps": 2, "warmup_steps": 2, "grpo_steps": 2, "lr0_steps": 1, "test_users": 4,
         "bootstrap_resamples": 50}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--modes", nargs="+", default=None, help="Score modes (default: likelihood exact).")
    parser.add_argument("--variants", nargs="+", default=None, help="full and/or lora (default: both).")
    parser.add_argument("--out", default=None, help="Where the runs' outputs go (default: runs/bench_sycophancy); "
                        "with --smoke, the JSON file of the summaries (required).")  # fmt: skip
    parser.add_argument("--tag", default="", help="Appended to each result's name: sycophancy_{mode}_{variant}_{tag}.")
    parser.add_argument("--smoke", action="store_true", help="Tiny sizes (SMOKE), runs in a temporary directory.")
    args = parser.parse_args()
    if args.modes is None:
        args.modes = ["likelihood"] if args.smoke else ["likelihood", "exact"]
    if args.variants is None:
        args.variants = ["full"] if args.smoke else ["full", "lora"]
    configure_threads()
    if not args.smoke:
        run_all(args, args.out or "runs/bench_sycophancy")
        return
    if args.out is None:
        parser.error("--smoke writes its JSON to --out FILE")
    with tempfile.TemporaryDirectory(prefix="bench-sycophancy-smoke-") as runs:
        summaries = run_all(args, runs, smoke=True)
    report_json({"smoke": True, "settings": SMOKE, "runs": summaries}, args.out)


def run_all(args: argparse.Namespace, runs: str, smoke: bool = False) -> dict:
    """Each mode × variant into ``runs/NAME``; the summaries by name (a smoke's are returned, not written)."""
    if not smoke:
        RESULTS.mkdir(exist_ok=True)
    first, summaries = None, {}
    for mode in args.modes:
        for variant in args.variants:
            suffix = (["quick"] if args.quick else []) + ([args.tag] if args.tag else [])
            name = "_".join(["sycophancy", mode, variant, *suffix])
            out = Path(runs) / name
            if not smoke and (RESULTS / f"{name}.json").is_file() and (out / "report.json").is_file():
                print(name, "done before: delete", out, "to rerun it")
                first = first or name
                continue
            if first is not None and not (out / "models" / "responder").is_dir():
                for stage in SHARED_STAGES:
                    shutil.copytree(Path(runs) / first / stage, out / stage, dirs_exist_ok=True)
            start = time.perf_counter()
            cfg = SycophancyConfig(out=str(out), quick=args.quick, score_mode=mode, use_peft=variant == "lora",
                                   **(SMOKE if smoke else {}))  # fmt: skip
            report = run_experiment(cfg)
            summary = {k: v for k, v in report.items() if k not in ("records", "evaluation")}
            summary["wall_s"] = round(time.perf_counter() - start, 1)
            summary["shared_stages_from"] = first
            first = first or name
            summaries[name] = summary
            if not smoke:
                report_json(summary, RESULTS / f"{name}.json")
            print(name, json.dumps({c: round(m["accuracy"], 3) for c, m in report["conditions"].items()}),
                  "passed" if report["passed"] else "NOT met", f"{summary['wall_s']} s")  # fmt: skip
    return summaries


if __name__ == "__main__":
    main()
