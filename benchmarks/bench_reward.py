"""Reward throughput on the embedded default: in-process likelihood scoring and one GRPO-sized reward call.

    python benchmarks/bench_reward.py [--out benchmarks/results/bench_reward.json]

Builds the tiny models and the FEVER fixture dataset in a temp dir, then measures responder prompts/s per batch
size, and the wall time of the counterfactual reward for a batch of G candidates per prompt (cold cache vs warm
baseline cache). Prints the figures and writes them as JSON. Figures are for this machine and the tiny models only.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import resource
import tempfile
import time
from pathlib import Path

import torch

from data_build.build import build_data, load_data_config
from memstate.data import load_split
from memstate.responder import TransformersResponder
from memstate.tiny_models import build_tiny_models
from reward.counterfactual import CounterfactualGainReward
from reward.judge import likelihood_judgements
from train.warmup import template_state

ROOT = Path(__file__).resolve().parents[1]


def timed(fn, repeats: int = 3) -> float:
    """Best wall time of ``repeats`` calls (seconds)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_reward.json"))
    parser.add_argument("--generations", type=int, default=8, help="Candidates per prompt (G).")
    parser.add_argument("--prompts", type=int, default=16, help="Prompts per reward call.")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        models = build_tiny_models(Path(tmp) / "models")
        config = load_data_config(ROOT / "configs" / "data" / "fever_fixture.yaml")
        config.progress = False
        build_data(config, Path(tmp) / "data")
        instances = load_split(Path(tmp) / "data", "train")
        results: dict = {
            "machine": {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
            },
            "responder": "tiny (memstate tiny-models)",
            "scoring_prompts_per_s": {},
        }
        rng = random.Random(0)
        for batch_size in (1, 8, 32):
            responder = TransformersResponder(str(models["responder"]), batch_size=batch_size)
            batch = instances[:64]
            rules = [tuple(r[2:] for r in template_state(i, rng).splitlines()) for i in batch]
            seconds = timed(lambda: likelihood_judgements(responder, batch, rules))  # noqa: B023
            results["scoring_prompts_per_s"][batch_size] = round(len(batch) / seconds, 1)

        responder = TransformersResponder(str(models["responder"]), batch_size=32)
        chosen = instances[: args.prompts]
        rows = [inst for inst in chosen for _ in range(args.generations)]
        completions = [template_state(inst, rng) for inst in rows]  # some duplicates, as in real groups
        columns = {k: [r.to_dict()[k] for r in rows] for k in rows[0].to_dict()}
        reward = CounterfactualGainReward(responder)
        start = time.perf_counter()
        reward(prompts=[None] * len(rows), completions=completions, **columns)
        cold = time.perf_counter() - start
        warm = timed(lambda: reward(prompts=[None] * len(rows), completions=completions, **columns))
        results["reward_call"] = {
            "completions": len(rows),
            "cold_cache_s": round(cold, 4),
            "warm_cache_s": round(warm, 4),
            "distinct_states": len({(r.id, c) for r, c in zip(rows, completions, strict=True)}),
        }
        results["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)

    print(json.dumps(results, indent=2))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
