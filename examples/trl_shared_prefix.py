"""Shared-prefix GRPO from a plain TRL script: the same short run with TRL's GRPOTrainer and SharedPrefixGRPOTrainer.

    python examples/trl_shared_prefix.py [--model DIR] [--prompts FILE] [--steps N] [--out FILE]

What a TRL user writes: a prompt-only dataset in TRL's conversational format (a JSONL file of ``{"prompt": [messages],
"answer": ...}``; examples/trl_shared_prefix/prompts.jsonl holds eight reading prompts of about 650 tokens that share
a system message), a reward function (the toy one below reads the dataset's ``answer`` column, as TRL passes extra
columns to rewards), a GRPOConfig, and a trainer. The model is memstate's tiny random-init policy (``memstate
tiny-models``) unless ``--model`` names another causal LM. Nothing of memstate is used but the trainer class.

Each trainer runs in a fresh process (peak memory is per process) with the same seed, data and GRPOConfig: G = 8
completions of up to 32 tokens per prompt, one group per micro-batch. Figures, one row per trainer:

- step s: the median wall time of the optimizer steps after the first (which holds the warm-up and, on the shared
  path, its first-use check), generation included;
- peak MiB: on CUDA ``torch.cuda.max_memory_allocated``; on CPU the growth of the process's peak resident set over
  its resident set just before training;
- token ratio: positions TRL's layout encodes in the training forward per micro-batch over those the packed rows
  encode (logged by the trainer as ``shared_prefix/token_ratio``; 1 for TRL's own);
- grad norm 1: the first step's gradient norm; the same completions are sampled in both runs at step 1, so the two
  paths' gradients should agree to float precision;
- reward: the mean reward over the run.

On CPU with the tiny 2-layer model the step is mostly generation and Python overhead, so the time ratio is far below
the token ratio; docs/shared_prefix.md has the training-pass figures measured on CPU and on an H200.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from transformers import TrainerCallback

HERE = Path(__file__).resolve().parent
PROMPTS = HERE / "trl_shared_prefix" / "prompts.jsonl"
TRAINERS = ("GRPOTrainer", "SharedPrefixGRPOTrainer")


def reward_answer(completions: list, answer: list[str], **kwargs) -> list[float]:
    """1 when the completion states the answer's figure; otherwise half the share of its characters that are digits
    (a random policy's rewards then vary within a group, so GRPO has advantages to learn from).

    >>> reward_answer([[{"role": "assistant", "content": "It was 1889."}], "no idea", "12 34"], ["1889", "63", "9"])
    [1.0, 0.0, 0.2]
    """
    rewards = []
    for completion, figure in zip(completions, answer, strict=True):
        text = completion[0]["content"] if isinstance(completion, list) else completion
        if figure in re.sub(r"(?<=\d),(?=\d)", "", text):
            rewards.append(1.0)
        else:
            rewards.append(round(0.5 * sum(c.isdigit() for c in text) / max(len(text), 1), 4))
    return rewards


class StepTimer(TrainerCallback):
    """Times each optimizer step."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def on_step_begin(self, *args, **kwargs) -> None:
        self.start = time.perf_counter()

    def on_step_end(self, *args, **kwargs) -> None:
        self.seconds.append(time.perf_counter() - self.start)


def train(trainer_name: str, model: str, prompts: Path, steps: int) -> dict:
    """One run, in this process; returns its figures."""
    import logging

    import torch
    from datasets import load_dataset
    from trl import GRPOConfig, GRPOTrainer

    from memstate.train.shared_prefix import SharedPrefixGRPOTrainer

    logging.basicConfig(format="%(name)s: %(message)s")
    logging.getLogger("memstate.train").setLevel(logging.INFO)  # the first-use check's figures
    cuda = torch.cuda.is_available()
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-shared-prefix-"),
        per_device_train_batch_size=8,
        num_generations=8,
        max_completion_length=32,
        max_steps=steps,
        learning_rate=1e-5,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        bf16=cuda,
        use_cpu=not cuda,
    )
    trainer_class = SharedPrefixGRPOTrainer if trainer_name == "SharedPrefixGRPOTrainer" else GRPOTrainer
    timer = StepTimer()
    trainer = trainer_class(
        model=model,
        reward_funcs=[reward_answer],
        args=args,
        train_dataset=load_dataset("json", data_files=str(prompts), split="train"),
        callbacks=[timer],
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = resident_mib()
    trainer.train()
    if cuda:
        peak = (torch.cuda.max_memory_allocated() - before) / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    logs = [e for e in trainer.state.log_history if "reward" in e]
    ratios = [e["shared_prefix/token_ratio"] for e in logs if "shared_prefix/token_ratio" in e]
    return {
        "trainer": trainer_name,
        "step_seconds": round(statistics.median(timer.seconds[1:] or timer.seconds), 3),
        "peak_mib": round(peak, 1),
        "token_ratio": round(statistics.mean(ratios), 2) if ratios else 1.0,
        "grad_norm_step1": logs[0]["grad_norm"],
        "mean_reward": round(statistics.mean(e["reward"] for e in logs), 4),
        "shared_prefix_active": getattr(trainer, "shared_prefix_active", None),
        "device": "cuda" if cuda else "cpu",
    }


def resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a causal LM (directory or Hub id); default: memstate's tiny policy")
    parser.add_argument("--prompts", type=Path, default=PROMPTS, help="a prompt-only JSONL dataset (TRL's format)")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per run (one group each)")
    parser.add_argument("--out", type=Path, help="also write the figures here as JSON")
    parser.add_argument("--child", choices=TRAINERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(train(args.child, args.model, args.prompts, args.steps)))
        return
    if args.model is None:
        from memstate.tiny_models import build_tiny_models

        args.model = str(build_tiny_models(tempfile.mkdtemp(prefix="tiny-models-"))["policy"])
    rows = []
    for name in TRAINERS:
        command = [sys.executable, __file__, "--child", name, "--model", args.model, "--prompts", str(args.prompts),
                   "--steps", str(args.steps)]  # fmt: skip
        print(f"== {name}", flush=True)
        proc = subprocess.run(command, stdout=subprocess.PIPE, text=True)  # its log and progress bars go to stderr
        if proc.returncode != 0:
            sys.exit(f"the {name} run failed (exit {proc.returncode}; its log is above)")
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    stock, shared = rows
    print(f"{'trainer':<26}{'step s':>9}{'peak MiB':>10}{'token ratio':>13}{'grad norm 1':>13}{'reward':>9}")
    for r in rows:
        print(f"{r['trainer']:<26}{r['step_seconds']:>9.3f}{r['peak_mib']:>10.1f}{r['token_ratio']:>13.2f}"
              f"{r['grad_norm_step1']:>13.4g}{r['mean_reward']:>9.4f}")  # fmt: skip
    time_ratio = stock["step_seconds"] / shared["step_seconds"]
    memory_ratio = stock["peak_mib"] / shared["peak_mib"] if shared["peak_mib"] > 0 else float("nan")
    print(f"TRL / shared-prefix: step time {time_ratio:.2f}x, peak memory {memory_ratio:.2f}x "
          f"({shared['device']}, {args.steps} steps, G = 8, 32-token completions)")  # fmt: skip
    if args.out:
        import torch
        import transformers
        import trl

        machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()}
        versions = {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__}
        result = {"command": " ".join(["python", os.path.relpath(__file__), *sys.argv[1:]]), "runs": rows,
                  "time_ratio": round(time_ratio, 2), "memory_ratio": round(memory_ratio, 2), "steps": args.steps,
                  "prompts": os.path.relpath(args.prompts), "machine": machine, "versions": versions,
                  "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"written to {args.out}")
    if not shared["shared_prefix_active"]:
        sys.exit("SharedPrefixGRPOTrainer fell back to TRL's path (see its log above)")


if __name__ == "__main__":
    main()
