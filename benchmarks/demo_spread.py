"""Run-to-run spread of `make demo`'s figures: how far another run of the same commit lands (tests/demo_tolerance.py).

    python benchmarks/demo_spread.py --seeds 0 1 2 3
    python benchmarks/demo_spread.py --smoke --out /tmp/demo_spread.json  # seconds: a check, not a measurement

The demo is deterministic on one CPU, but another CPU rounds floats differently and training then takes another path
(another policy, sometimes another best checkpoint). The CIs a run prints are over its test users for one trained
policy; they say nothing of how far a second training run lands. This reruns the demo's train and eval stages, the
commands ``memstate demo`` runs, with training seed ``s`` and everything that measures held as the demo holds it
(validation subset drawn with seed 0, test states sampled with seed 0), and writes each run's summary
(experiment/demo.py's ``summarize``) to ``benchmarks/results/demo_spread.json``. Another seed stands in for another
CPU, and goes further: a CPU's run follows the demo's until a rounding flips a sampled token, a seed's differs from
the first step (another order of training instances, other sampled states), so this spread bounds a CPU's from above.

``--smoke`` runs the same commands and summary at a size that finishes in seconds, from any working directory (the
demo's configs and shipped models read from the repository by absolute path, everything written to a temporary
directory): one seed; the world's data for 20 users (the demo's data config with ``users`` changed, and the shortcut
probes' verdict a warning: at that size noise beats their margin); 2 GRPO steps of 2 prompts x 4 states, one
validation on 4 instances at step 2 (its checkpoint is ``best``); the test evaluation on its first 8 instances. Its
JSON says ``"smoke": true`` and goes to ``--out`` (default: the system's temporary directory).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import yaml
from results_io import ROOT, default_out, report

from memstate.cli import main as memstate
from memstate.experiment.demo import EVAL_TEMPERATURE, WORLD, Demo, render, summarize

SMOKE_USERS = 20
SMOKE_TRAIN = ["--max_steps", "2", "--per_device_train_batch_size", "8", "--steps_per_generation", "1",
               "--logging_steps", "1", "--save_steps", "2", "--eval_steps", "2", "--max_validation_instances", "4",
               "--per_device_eval_batch_size", "8"]  # fmt: skip
SMOKE_EVAL = ["--max_instances", "8"]


def run_seed(seed: int, out: Path, world: Demo = WORLD, train_extra=(), eval_extra=()) -> dict:
    """Train the demo at ``seed`` under ``out`` and evaluate it as the demo does; the demo's summary of that run.
    ``world``: the demo's settings (``--smoke``: with absolute paths); ``train_extra``/``eval_extra``: arguments
    appended to the two commands (``--smoke``'s sizes)."""
    train_dir = out / f"seed{seed}"
    demo = Demo(world.name, world.data_config, world.data_dir, world.train_config, train_dir, ("best",))
    seconds = {}
    for name, argv in (
        ("train", ["train", "--config", demo.train_config, "--seed", str(seed), "--validation_seed", "0",
                   "--output_dir", str(train_dir), *train_extra]),
        ("eval_best", ["eval", "--checkpoint", str(train_dir / "best"), "--split", "test", "--temperature",
                       EVAL_TEMPERATURE, "--batch_size", "64", *eval_extra]),
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


def smoke_world(tmp: Path) -> tuple[Demo, list[str]]:
    """``--smoke``'s demo: the demo's data config with ``SMOKE_USERS`` users, its data and runs under ``tmp``, its
    train config and shipped models read from the repository; and the train arguments that point there."""
    data_config = yaml.safe_load((ROOT / WORLD.data_config).read_text())
    data_config["synthetic"]["users"] = SMOKE_USERS
    data_config["shortcut_probe"] = "warn"  # the probes still run; at 60 instances a split's noise can beat them
    (tmp / "data.yaml").write_text(yaml.safe_dump(data_config))
    train_config = yaml.safe_load((ROOT / WORLD.train_config).read_text())
    world = Demo(WORLD.name, str(tmp / "data.yaml"), str(tmp / "data"), str(ROOT / WORLD.train_config),
                 tmp / "train", WORLD.evaluated)  # fmt: skip
    paths = ["--data_dir", world.data_dir]
    for key in ("policy_model", "responder_model"):  # relative to the repository root, as the config says
        paths += [f"--{key}", str(ROOT / train_config[key])]
    return world, paths + SMOKE_TRAIN


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 0 1 2 3 (--smoke: 0)")
    parser.add_argument("--work", default=None, help="Where the runs go (runs/demo_spread; --smoke: a temp dir).")
    parser.add_argument("--out", default=None, help="default: benchmarks/results/demo_spread.json (--smoke: in /tmp)")
    parser.add_argument("--smoke", action="store_true", help="seconds, the same commands: see the module docstring")
    args = parser.parse_args()
    args.seeds = args.seeds or ([0] if args.smoke else [0, 1, 2, 3])
    args.out = args.out or default_out("demo_spread.json", args.smoke)
    with tempfile.TemporaryDirectory() as tmp:
        world, train_extra, eval_extra = WORLD, [], []
        if args.smoke:
            world, train_extra = smoke_world(Path(tmp))
            eval_extra = SMOKE_EVAL
        work = args.work or (str(Path(tmp) / "runs") if args.smoke else "runs/demo_spread")
        if memstate(["build-data", "--config", world.data_config, "--out", world.data_dir]):
            raise SystemExit("build-data failed")
        runs = {str(seed): run_seed(seed, Path(work), world, train_extra, eval_extra) for seed in args.seeds}
    results = {"demo_train_config": WORLD.train_config, "eval_temperature": EVAL_TEMPERATURE, "runs": runs}
    report(({"smoke": True, "smoke_train_arguments": train_extra, "smoke_eval_arguments": eval_extra}
            if args.smoke else {}) | results, args.out)  # fmt: skip


if __name__ == "__main__":
    main()
