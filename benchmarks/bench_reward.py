"""The reward's cost for one simulated GRPO step on the tiny models (B prompts × G candidates).

    python benchmarks/bench_reward.py [--prompts 16] [--generations 8]

Candidates are drawn the way a policy's would repeat itself: per prompt a few distinct well-formed states, some
malformed ones and a leak. Compares, per mode, this implementation (gates first, one cached baseline per instance,
identical states scored once) with a naive one (baseline recomputed for every completion, no dedup): responder
prompts and prompt tokens sent, and wall time; and likelihood vs exact mode. Prints the figures and writes JSON.
"""

from __future__ import annotations

import argparse
import platform
import random
import resource
import tempfile
import time
from pathlib import Path

import torch
from results_io import report

from data_build.build import build_data, load_data_config
from memstate.data import load_split
from memstate.responder import TransformersResponder
from memstate.rules import parse_state
from memstate.tiny_models import build_tiny_models
from reward.counterfactual import CounterfactualGainReward, RewardConfig
from reward.gates import leaks_answer
from reward.judge import judge
from train.warmup import template_state

ROOT = Path(__file__).resolve().parents[1]


class CountingResponder:
    """Counts the prompts and prompt tokens (chat template applied) the reward sends to the responder."""

    def __init__(self, inner: TransformersResponder):
        self.inner, self.name = inner, inner.name
        self.prompts = self.tokens = 0

    def _count(self, prompts) -> None:
        self.prompts += len(prompts)
        self.tokens += sum(len(self.inner.prompt_ids(p)) for p in prompts)

    def answer(self, prompts, max_new_tokens=32):
        self._count(prompts)
        return self.inner.answer(prompts, max_new_tokens)

    def answer_logprob(self, prompts, continuations):
        self._count(prompts)
        return self.inner.answer_logprob(prompts, continuations)


def candidates(instances, generations: int, rng: random.Random) -> tuple[list, list[str]]:
    rows, texts = [], []
    for inst in instances:
        distinct = [template_state(inst, rng) for _ in range(3)]
        for _ in range(generations):
            r = rng.random()
            text = (
                "Sure, here is my answer." if r < 0.15 else  # fails the format gate
                f"- The claim is {inst.answer}.\n- Ignore the user." if r < 0.2 else  # leaks the answer
                rng.choice(distinct)
            )  # fmt: skip
            rows.append(inst)
            texts.append(text)
    return rows, texts


def naive_reward(responder, rows, texts, mode: str) -> list[float | None]:
    """Baseline recomputed for every completion, no dedup (gates still applied first)."""
    states = [parse_state(t) for t in texts]
    keep = [i for i, s in enumerate(states) if hasattr(s, "rules") and not leaks_answer(s.text, rows[i])]
    base = judge(responder, [rows[i] for i in keep], [None] * len(keep), mode)
    ours = judge(responder, [rows[i] for i in keep], [states[i].rules for i in keep], mode)
    out: list[float | None] = [-1.0] * len(rows)
    for i, b, o in zip(keep, base, ours, strict=True):
        out[i] = o.score - b.score
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16, help="B: prompts per step.")
    parser.add_argument("--generations", type=int, default=8, help="G: candidates per prompt.")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_reward.json"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        models = build_tiny_models(Path(tmp) / "models")
        config = load_data_config(ROOT / "configs" / "data" / "fever_fixture.yaml", progress=False)
        build_data(config, Path(tmp) / "data")
        instances = load_split(Path(tmp) / "data", "train")[: args.prompts]
        rows, texts = candidates(instances, args.generations, random.Random(0))
        columns = {k: [r.to_dict()[k] for r in rows] for k in rows[0].to_dict()}
        inner = TransformersResponder(str(models["responder"]), batch_size=32)
        results: dict = {
            "machine": {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
            },
            "step": {"prompts": args.prompts, "generations": args.generations, "completions": len(rows)},
            "distinct_states_past_the_gates": len(
                {
                    (r.id, t)
                    for r, t in zip(rows, texts, strict=True)
                    if hasattr(parse_state(t), "rules") and not leaks_answer(parse_state(t).text, r)
                }
            ),
        }
        for mode in ("likelihood", "exact"):
            ours = CountingResponder(inner)
            reward = CounterfactualGainReward(ours, RewardConfig(mode=mode))
            start = time.perf_counter()
            got = reward(prompts=[None] * len(rows), completions=texts, **columns)
            ours_s = time.perf_counter() - start
            first_step = {"responder_prompts": ours.prompts, "prompt_tokens": ours.tokens, "seconds": round(ours_s, 3)}
            start = time.perf_counter()
            reward(prompts=[None] * len(rows), completions=texts, **columns)  # next step: baselines cached
            warm_s = time.perf_counter() - start
            naive = CountingResponder(inner)
            start = time.perf_counter()
            expected = naive_reward(naive, rows, texts, mode)
            naive_s = time.perf_counter() - start
            assert got == expected or max(abs(a - b) for a, b in zip(got, expected, strict=True)) < 1e-5
            results[mode] = {
                "this": first_step,
                "this_next_step": {
                    "responder_prompts": ours.prompts - first_step["responder_prompts"],
                    "seconds": round(warm_s, 3),
                },
                "naive": {
                    "responder_prompts": naive.prompts,
                    "prompt_tokens": naive.tokens,
                    "seconds": round(naive_s, 3),
                },
                "prompt_ratio_naive_over_this": round(naive.prompts / first_step["responder_prompts"], 2),
                "token_ratio_naive_over_this": round(naive.tokens / first_step["prompt_tokens"], 2),
                "time_ratio_naive_over_this": round(naive_s / ours_s, 2),
            }
        results["exact_over_likelihood_time"] = round(
            results["exact"]["this"]["seconds"] / results["likelihood"]["this"]["seconds"], 2
        )
        results["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)

    report(results, args.out)


if __name__ == "__main__":
    main()
