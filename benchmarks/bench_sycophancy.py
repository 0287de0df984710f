"""Run `memstate experiment sycophancy` for score modes × (full, LoRA) and keep the figures.

    python benchmarks/bench_sycophancy.py [--quick] [--modes likelihood exact] [--variants full lora]

Each run's summary (per condition accuracy, Δ vs no state with its 95% CI, sycophancy and outdated-preference rates;
checkpoint − self-guide; the criteria; the responder's measured behaviour; stage timings and wall time) goes to
``benchmarks/results/sycophancy_{mode}_{variant}[_quick][_TAG].json``, led by the command, time and load. Every run
after the first starts from a copy of the first run's data, responder and warmed-up policy (none depends on the
score mode or on LoRA; rebuilding them would reproduce the same files in ~14.5 min), and its summary says so
(``shared_stages_from``; its ``timings_s`` then show those stages as reused).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from results_io import report as report_json

from memstate.experiment.sycophancy import SycophancyConfig, run_experiment
from memstate.threads import configure_threads

RESULTS = Path(__file__).resolve().parent / "results"
# What neither the score mode nor LoRA changes (``run_experiment`` reuses a stage whose output exists).
SHARED_STAGES = ("data", "models/policy-init", "models/responder-init", "models/responder", "models/policy-warmup")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--modes", nargs="+", default=["likelihood", "exact"])
    parser.add_argument("--variants", nargs="+", default=["full", "lora"])
    parser.add_argument("--out", default="runs/bench_sycophancy", help="Where the runs' outputs go.")
    parser.add_argument("--tag", default="", help="Appended to each result's name: sycophancy_{mode}_{variant}_{tag}.")
    args = parser.parse_args()
    configure_threads()
    RESULTS.mkdir(exist_ok=True)
    first = None
    for mode in args.modes:
        for variant in args.variants:
            suffix = (["quick"] if args.quick else []) + ([args.tag] if args.tag else [])
            name = "_".join(["sycophancy", mode, variant, *suffix])
            out = Path(args.out) / name
            if (RESULTS / f"{name}.json").is_file() and (out / "report.json").is_file():
                print(name, "done before: delete", out, "to rerun it")
                first = first or name
                continue
            if first is not None and not (out / "models" / "responder").is_dir():
                for stage in SHARED_STAGES:
                    shutil.copytree(Path(args.out) / first / stage, out / stage, dirs_exist_ok=True)
            start = time.perf_counter()
            cfg = SycophancyConfig(out=str(out), quick=args.quick, score_mode=mode, use_peft=variant == "lora")
            report = run_experiment(cfg)
            summary = {k: v for k, v in report.items() if k not in ("records", "evaluation")}
            summary["wall_s"] = round(time.perf_counter() - start, 1)
            summary["shared_stages_from"] = first
            first = first or name
            report_json(summary, RESULTS / f"{name}.json")
            print(name, json.dumps({c: round(m["accuracy"], 3) for c, m in report["conditions"].items()}),
                  "passed" if report["passed"] else "NOT met", f"{summary['wall_s']} s")  # fmt: skip


if __name__ == "__main__":
    main()
