"""A tiny GRPO step alone and next to a second busy torch process, with default threads and with configure_threads().

    python benchmarks/bench_threads.py [--steps 6] [--repeats 3] [--busy matmul|grpo] [--workload grpo|lm]
    python benchmarks/bench_threads.py --smoke --out /tmp/bench_threads.json  # seconds: a check, not a measurement

The step is TRL's GRPOTrainer on the tiny CPU setup of ``configs/train/tiny_cpu.yaml`` (tiny random policy after
that config's format warm-up, the counterfactual reward in likelihood mode with the tiny in-process responder, 2
prompts x G=4, 64 completion tokens), timed per step with a TrainerCallback; the first step of each run is not
counted. Each run is a fresh process, so the thread settings are those a process starts with. Four settings:

- alone / busy: the GRPO process on its own, or next to a second torch process that is busy the whole time
  (``--busy matmul``: a loop of 256x256 matmuls and element-wise ops on 64 K floats, i.e. many small parallel
  regions, like a tiny model; ``--busy grpo``: a second copy of the same GRPO run, looping);
- before / after: both processes with the default thread settings (thread variables removed from their
  environment), or both calling ``memstate.threads.configure_threads()`` first thing.

``--workload lm`` times a plain training step instead (forward, backward, AdamW) of a random-init Qwen3-architecture
model (4 layers, hidden 256, batch 8 x 128 tokens) built from its config by transformers: no TRL, no data build, for
machines that have only torch and transformers (the lent GPU machine: its CPU cores are what is measured).

Prints per-setting medians of the step time (over all timed steps of all repeats), the slowdown (busy / alone)
before and after, the busy neighbour's throughput, the machine load, and writes JSON.

``--smoke`` runs the same code at a size that finishes in seconds: one setting (busy/after: the neighbour and
``configure_threads`` both run), one repeat of 2 steps of 1 prompt x G=4 with 32 completion tokens, a 1-step format
warm-up; the slowdowns need both an alone and a busy setting, so it has none. Its JSON says ``"smoke": true`` and
goes to ``--out`` (default: the system's temporary directory).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_io import default_out, report

from memstate.threads import THREAD_VARS  # removed from the children's environment for the "before" settings

ROOT = Path(__file__).resolve().parents[1]
TINY_CPU = ROOT / "configs" / "train" / "tiny_cpu.yaml"


def _configure(on: bool) -> dict | None:
    if not on:
        return None
    from memstate.threads import configure_threads  # before torch is imported: libgomp reads the wait policy

    plan = configure_threads()
    return {"threads": plan.threads, "exported": plan.exported, "kept": plan.kept}


def child_grpo(args: argparse.Namespace) -> None:
    """One GRPO run of ``--steps`` steps; prints one JSON line with the step times (or loops, as a neighbour)."""
    plan = _configure(args.configure)
    import dataclasses

    import torch
    import yaml
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from memstate.data import load_split
    from memstate.responders.local import TransformersResponder
    from memstate.reward.counterfactual import CounterfactualGainReward, RewardConfig
    from memstate.train.data import grpo_dataset

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []

        def on_step_begin(self, *_, **__):
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            self.seconds.append(time.perf_counter() - self.start)

    # The config's TRL fields as they are; built here rather than through memstate's own argument parsing, so the
    # benchmark measures the same step whatever that parsing looks like.
    yaml_config = yaml.safe_load(TINY_CPU.read_text())
    if args.smoke:  # one prompt x G = 4 per step, 32 completion tokens
        yaml_config |= {"per_device_train_batch_size": 4, "max_completion_length": 32}
    grpo_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    config = GRPOConfig(
        **{k: v for k, v in yaml_config.items() if k in grpo_fields}
        | {
            "output_dir": args.work,
            "max_steps": args.steps,
            "save_strategy": "no",
            "eval_strategy": "no",  # the config validates on a split this timing run does not build
            "report_to": "none",
            "logging_steps": 1,
            "disable_tqdm": True,
        }
    )
    instances = load_split(args.data, "train")
    responder = TransformersResponder(str(Path(args.models) / "responder"), batch_size=32)
    mode = yaml_config.get("score_mode", yaml_config.get("reward_mode", "likelihood"))
    reward = CounterfactualGainReward(responder, RewardConfig(mode=mode))
    tokenizer = AutoTokenizer.from_pretrained(args.policy)
    dataset, _ = grpo_dataset(instances, tokenizer, yaml_config.get("max_prompt_tokens", 8192))
    while True:
        timer = StepTimer()
        trainer = GRPOTrainer(
            model=args.policy,
            reward_funcs=[reward],
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[timer],
        )
        trainer.train()
        if not args.loop:
            break
    print(
        json.dumps(
            {"step_seconds": timer.seconds, "torch_threads": torch.get_num_threads(), "plan": plan}, default=str
        ),
        flush=True,
    )


def child_lm(args: argparse.Namespace) -> None:
    """``--steps`` training steps of a small random-init Qwen3 on CPU; prints one JSON line with the step times."""
    plan = _configure(args.configure)
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    shape = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4}
    config = Qwen3Config(vocab_size=4096, num_key_value_heads=2, head_dim=64, max_position_embeddings=512, **shape)
    model = Qwen3ForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (8, 128))
    seconds = []
    for _ in range(args.steps):
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        seconds.append(time.perf_counter() - start)
    print(json.dumps({"step_seconds": seconds, "torch_threads": torch.get_num_threads(), "plan": plan}), flush=True)


def child_matmul(args: argparse.Namespace) -> None:
    """Busy until SIGTERM: small matmuls and element-wise ops; writes iterations per second to ``--work``."""
    _configure(args.configure)
    import torch

    stop = False

    def on_term(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    x = torch.randn(65536)
    start, iterations = time.perf_counter(), 0
    print("ready", flush=True)
    while not stop:
        c = a @ b
        x = torch.tanh(x * 0.5 + 0.1)
        a = c / c.norm()
        iterations += 1
    Path(args.work).write_text(json.dumps({"iterations_per_s": iterations / (time.perf_counter() - start)}))


def child_env() -> dict[str, str]:
    """The environment of a child: thread variables removed ("before" = defaults; "after" sets its own)."""
    return {k: v for k, v in os.environ.items() if k not in THREAD_VARS} | {"WANDB_MODE": "disabled"}


def run_setting(args, paths: dict, configure: bool, busy: bool, tmp: Path, tag: str) -> dict:
    env = child_env()
    me = [sys.executable, str(Path(__file__).resolve())]
    common = [f"--{k}={v}" for k, v in paths.items()]
    flag = (["--configure"] if configure else []) + (["--smoke"] if args.smoke else [])
    neighbour, neighbour_out = None, tmp / f"{tag}-busy.json"
    if busy:
        if args.busy == "matmul":
            cmd = [*me, "--child", "matmul", "--work", str(neighbour_out), *flag]
        else:
            cmd = [*me, "--child", "grpo", "--loop", "--steps", "1000", "--work", str(tmp / f"{tag}-n"), *common, *flag]
        neighbour = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if args.busy == "matmul":
            assert neighbour.stdout.readline().strip() == "ready"
        else:
            time.sleep(20)  # past its start-up: loading models and building the trainer
    try:
        cmd = [*me, "--child", args.workload, "--steps", str(args.steps), "--work", str(tmp / tag), *common, *flag]
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        wall = time.perf_counter() - start
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)}\n{proc.stderr[-5000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1]) | {"process_seconds": round(wall, 1)}
    finally:
        if neighbour is not None:
            neighbour.send_signal(signal.SIGTERM)
            neighbour.wait(timeout=60)
    if busy and args.busy == "matmul":
        result["neighbour"] = json.loads(neighbour_out.read_text())
    return result


def setup(tmp: Path, smoke: bool = False) -> dict:
    import yaml

    from memstate.data import load_split
    from memstate.data_build.build import build_data, load_data_config
    from memstate.tiny_models import build_tiny_models
    from memstate.train.warmup import format_warmup

    train_config = yaml.safe_load(TINY_CPU.read_text())
    if smoke:
        train_config["format_warmup_steps"] = 1
    models = build_tiny_models(tmp / "models")
    config = load_data_config(ROOT / "configs" / "data" / "fever_fixture.yaml", progress=False)
    build_data(config, tmp / "data")
    policy = format_warmup(
        str(models["policy"]),
        load_split(tmp / "data", "train"),
        tmp / "warm",
        steps=train_config["format_warmup_steps"],
        learning_rate=train_config["format_warmup_learning_rate"],
        seed=train_config["seed"],
        use_cpu=True,
    )
    return {"models": tmp / "models", "data": tmp / "data", "policy": policy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="Steps per run, the first not counted (6; --smoke: 2).")
    parser.add_argument("--repeats", type=int, default=None, help="Runs per setting, interleaved (3; --smoke: 1).")
    parser.add_argument("--busy", choices=["matmul", "grpo"], default="matmul", help="The busy neighbour.")
    parser.add_argument("--workload", choices=["grpo", "lm"], default="grpo", help="The timed process (see above).")
    parser.add_argument("--timeout", type=float, default=1800, help="Seconds one GRPO run may take.")
    parser.add_argument("--out", default=None, help="default: benchmarks/results/bench_threads.json (--smoke: in /tmp)")
    parser.add_argument("--smoke", action="store_true", help="seconds, the same code: see the module docstring")
    # child processes
    parser.add_argument("--child", choices=["grpo", "lm", "matmul"], help=argparse.SUPPRESS)
    parser.add_argument("--configure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--loop", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--models", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--policy", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        {"grpo": child_grpo, "lm": child_lm, "matmul": child_matmul}[args.child](args)
        return
    args.steps = args.steps or (2 if args.smoke else 6)
    args.repeats = args.repeats or (1 if args.smoke else 3)
    args.out = args.out or default_out("bench_threads.json", args.smoke)

    settings = [(configure, busy) for configure in (False, True) for busy in (False, True)]
    if args.smoke:
        settings = [(True, True)]
    runs: dict[str, list[dict]] = {}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        paths = setup(tmp, args.smoke) if args.workload == "grpo" or args.busy == "grpo" else {}
        for repeat in range(args.repeats):
            for configure, busy in settings:
                name = f"{'busy' if busy else 'alone'}/{'after' if configure else 'before'}"
                result = run_setting(args, paths, configure, busy, tmp, f"{name.replace('/', '-')}-{repeat}")
                result["load_1min_after"] = round(os.getloadavg()[0], 2)
                loads.append(os.getloadavg()[0])
                runs.setdefault(name, []).append(result)
                timed = result["step_seconds"][1:]
                print(f"{name} #{repeat}: step median {statistics.median(timed):.2f} s, load {loads[-1]:.2f}")

    table = {}
    for name, results in runs.items():
        timed = [s for r in results for s in r["step_seconds"][1:]]
        table[name] = {
            "median_step_s": round(statistics.median(timed), 3),
            "run_medians_s": [round(statistics.median(r["step_seconds"][1:]), 3) for r in results],
            "torch_threads": results[0]["torch_threads"],
        }
        if "neighbour" in results[0]:
            table[name]["neighbour_iterations_per_s"] = round(
                statistics.median(r["neighbour"]["iterations_per_s"] for r in results), 1
            )
    import torch

    results = {
        **({"smoke": True} if args.smoke else {}),
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": len(os.sched_getaffinity(0)),
            "load_1min_median": round(statistics.median(loads), 2),
            "load_1min_max": round(max(loads), 2),
        },
        "workload": {
            "timed": args.workload,
            "config": "configs/train/tiny_cpu.yaml after its format warm-up"
            if args.workload == "grpo"
            else "random-init Qwen3 (4 layers, hidden 256), batch 8 x 128, AdamW",
            "steps_per_run": args.steps,
            "timed_steps_per_run": args.steps - 1,
            "repeats": args.repeats,
            "busy_neighbour": args.busy,
        },
        "settings": table,
        "slowdown_busy_over_alone": {
            when: round(table[f"busy/{when}"]["median_step_s"] / table[f"alone/{when}"]["median_step_s"], 2)
            for when in ("before", "after")
            if f"busy/{when}" in table and f"alone/{when}" in table  # all four but in a smoke run
        },
        "runs": runs,
    }
    report(results, args.out)


if __name__ == "__main__":
    main()
