"""Run-to-run spread of `make demo`'s figures: how far another run of the same commit lands (tests/demo_tolerance.py).

    python benchmarks/demo_spread.py --seeds 0 1 2 3

The demo is deterministic on one CPU, but another CPU rounds floats differently and training then takes another path
(another policy, sometimes another best checkpoint). The CIs a run prints are over its test users for one trained
policy; they say nothing of how far a second training run lands. This reruns the demo's train and eval stages, the
commands ``memstate demo`` runs, with training seed ``s`` and everything that measures held as the demo holds it
(validation subset drawn with seed 0, test states sampled with seed 0), and writes each run's summary
(experiment/demo.py's ``summarize``) to ``benchmarks/results/demo_spread.json``. Another seed stands in for another
CPU, and goes further: a CPU's run follows the demo's until a rounding flips a sampled token, a seed's differs from
the first step (another order of training instances, other sampled states), so this spread bounds a CPU's from above.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from results_io import ROOT, report

from memstate.cli import main as memstate
from memstate.experiment.demo import EVAL_TEMPERATURE, WORLD, Demo, render, summarize


def run_seed(seed: int, out: Path) -> dict:
    """Train the demo at ``seed`` under ``out`` and evaluate it as the demo does; the demo's summary of that run."""
    train_dir = out / f"seed{seed}"
    demo = Demo(WORLD.name, WORLD.data_config, WORLD.data_dir, WORLD.train_config, train_dir, ("best",))
    seconds = {}
    for name, argv in (
        ("train", ["train", "--config", demo.train_config, "--seed", str(seed), "--validation_seed", "0",
                   "--output_dir", str(train_dir)]),
        ("eval_best", ["eval", "--checkpoint", str(train_dir / "best"), "--split", "test", "--temperature",
                       EVAL_TEMPERATURE, "--batch_size", "64"]),
    ):  # fmt: skip
        start = time.perf_counter()
        if train_dir.is_dir() and name == "train":
            if (train_dir / "best.json").is_file():
                print(f"seed {seed}: {train_dir} already trained, kept", flush=True)
                continue
            raise SystemExit(f"{train_dir} holds an unfinished run: remove it")
        if code := memstate(argv):
            raise SystemExit(f"seed {seed}: memstate {name} exited {code}")
        seconds[name] = time.perf_counter() - start
    summary = summarize(demo, seconds)
    print(render(summary), flush=True)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--work", default="runs/demo_spread", help="Where the runs go.")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "demo_spread.json"))
    args = parser.parse_args()
    if memstate(["build-data", "--config", WORLD.data_config, "--out", WORLD.data_dir]):
        raise SystemExit("build-data failed")
    runs = {str(seed): run_seed(seed, Path(args.work)) for seed in args.seeds}
    report({"demo_train_config": WORLD.train_config, "eval_temperature": EVAL_TEMPERATURE, "runs": runs}, args.out)


if __name__ == "__main__":
    main()
