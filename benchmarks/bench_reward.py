"""The reward's cost for one simulated GRPO step on the tiny models (B prompts × G candidates).

    python benchmarks/bench_reward.py [--prompts 16] [--generations 8]
    python benchmarks/bench_reward.py --smoke --out /tmp/bench_reward.json  # seconds: a check, not a measurement

Candidates are sampled from a policy, as GRPO would: the tiny random policy after the project's supervised format
warm-up (``train.warmup.format_warmup`` with ``configs/train/tiny_cpu.yaml``'s steps, learning rate and seed, on the
train split), G completions per prompt at temperature 1.0, top-k 0, top-p 1.0 (TRL's defaults) and that config's
``max_completion_length``. How often a group repeats a state is therefore measured, not built in: the figures give
the format and leak rates, the distinct states per group, the duplicate rate past the gates and the responder
prompts dedup saves. Compares, per mode, this implementation (gates first, one cached baseline per instance,
identical states scored once, answer-flow probabilities cached) with a naive one that computes the same reward
(``RewardConfig``'s defaults: the answer-flow check and its credit on) completion by completion: the no-memory
answer-flow pair (the state alone, and neither) asked for every completion past the gates, the baseline recomputed
for every completion that still stands, no dedup, no cache. Both send their responder prompts through the same
counting wrapper, the answer-flow prompts included, so the prompt and token counts compare like for like; the rewards
must agree (to 1e-5), so a dedup or cache that handed a completion another state's or instance's figure fails here.
Reports responder prompts and prompt tokens sent, and wall time; and likelihood vs exact mode. Prints the figures and
writes JSON.

``--smoke`` runs the same code at a size that finishes in seconds: 2 prompts x 4 candidates, a 1-step warm-up, 32
sampled tokens, and two copies of one fixed well-formed state added to each prompt's candidates (the barely warmed-up
policy writes none, and these give the gates, the answer-flow check, dedup and the reward-vs-naive check something to
pass); its JSON says ``"smoke": true`` and goes to ``--out`` (default: the system's temporary directory).
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch
import yaml
from results_io import default_out, report
from transformers import AutoModelForCausalLM, AutoTokenizer

from memstate.data import load_split
from memstate.data_build.build import build_data, load_data_config
from memstate.leak import leaks_answer
from memstate.prompts import policy_messages
from memstate.responders.local import TransformersResponder
from memstate.reward.answer_flow import (
    AnswerFlowCheck,
    candidate_probabilities,
    flow_continuations,
    flow_messages,
    flow_shift,
)
from memstate.reward.counterfactual import CounterfactualGainReward, RewardConfig, credited_gain
from memstate.reward.fit import fit_to_responder
from memstate.reward.responder_score import judge
from memstate.rules import parse_state
from memstate.schema import Instance
from memstate.tiny_models import build_tiny_models
from memstate.train.warmup import format_warmup

ROOT = Path(__file__).resolve().parents[1]
# --smoke's fixed well-formed state (no candidate answer named), added twice to each prompt's sampled candidates
SMOKE_STATE = "- Trust the evidence sentences over the user's own belief.\n- Ignore who the user says they are."


class CountingResponder:
    """Counts the prompts and prompt tokens (chat template applied) the reward sends to the responder."""

    def __init__(self, inner: TransformersResponder):
        self.inner, self.name, self.identity = inner, inner.name, inner.identity
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


def sample_candidates(
    policy: Path, instances: list[Instance], generations: int, max_new_tokens: int, seed: int, batch: int = 4
) -> tuple[list[Instance], list[str]]:
    """``generations`` sampled completions per instance (grouped, as TRL repeats each prompt G times)."""
    tokenizer = AutoTokenizer.from_pretrained(policy)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(policy).eval()
    torch.manual_seed(seed)
    rows, texts = [], []
    for start in range(0, len(instances), batch):
        chunk = instances[start : start + batch]
        prompts = [
            tokenizer.apply_chat_template(policy_messages(i), add_generation_prompt=True, tokenize=False) for i in chunk
        ]
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 num_return_sequences=generations, max_new_tokens=max_new_tokens,
                                 pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        texts += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        rows += [inst for inst in chunk for _ in range(generations)]  # generate keeps each prompt's samples together
    return rows, texts


def candidate_figures(rows: list[Instance], texts: list[str]) -> dict:
    """What the sampled candidates are: gate outcomes, and how often a group repeats a state past the gates (the
    reward scores each distinct (instance, state) once, so repeats are what dedup saves)."""
    states = [parse_state(t) for t in texts]
    ok = [hasattr(s, "rules") for s in states]
    passed = [i for i, s in enumerate(states) if ok[i] and not leaks_answer(s.text, rows[i])]
    groups: dict[str, set[str]] = {r.id: set() for r in rows}
    for i in passed:
        groups[rows[i].id].add(states[i].text)
    per_group = [len(g) for g in groups.values()]
    distinct = sum(per_group)
    raw_per_group = [len({t for r, t in zip(rows, texts, strict=True) if r.id == gid}) for gid in groups]
    return {
        "format_ok_rate": round(sum(ok) / len(texts), 3),
        "leak_rate": round((sum(ok) - len(passed)) / len(texts), 3),
        "distinct_texts_per_group_mean": round(statistics.mean(raw_per_group), 2),
        "past_the_gates": len(passed),
        "distinct_states_past_the_gates": distinct,
        "distinct_states_per_group": {
            "mean": round(statistics.mean(per_group), 2),
            "min": min(per_group),
            "max": max(per_group),
        },
        "duplicate_rate_past_the_gates": round(1 - distinct / len(passed), 3) if passed else None,
        "responder_prompts_saved_by_dedup": len(passed) - distinct,
        "examples": texts[:3],
    }


def naive_reward(responder, rows: list[Instance], texts: list[str], config: RewardConfig) -> list[float | None]:
    """The reward ``CounterfactualGainReward(responder, config)`` gives, computed completion by completion from the
    same public pieces, with no dedup and no cache: the format and leak gates; then, with the answer-flow check on,
    two no-memory prompts per completion past them (``flow_messages``: the state alone, and neither), its shift
    (``flow_shift``) and, above the threshold, the leak penalty; then, for every completion still standing, the
    baseline recomputed and the with-state prompt, and the reward ``credited_gain(gain, shift)`` (the gain alone with
    the credit off). ``None`` where the responder could not score a prompt, as the reward leaves it."""
    shown = fit_to_responder(responder, rows)  # what the responder is shown (the gates read the instances as built)
    states = [parse_state(t) for t in texts]
    out: list[float | None] = [None] * len(rows)
    keep = []
    for i, state in enumerate(states):
        if not hasattr(state, "rules"):
            out[i] = config.format_penalty
        elif leaks_answer(state.text, rows[i]):
            out[i] = config.leak_penalty
        else:
            keep.append(i)
    shift: dict[int, float | None] = dict.fromkeys(keep)
    if config.answer_flow_check and keep:
        check = AnswerFlowCheck(responder, config.answer_flow_threshold)  # for its threshold rule only
        asked = [(i, states[i].rules) for i in keep] + [(i, None) for i in keep]
        answers = responder.answer_logprob(
            [flow_messages(shown[i], rules) for i, rules in asked], [flow_continuations(shown[i]) for i, _ in asked]
        )
        probs = [None if a is None else candidate_probabilities(a, bool(shown[i].candidates))
                 for (i, _), a in zip(asked, answers, strict=True)]  # fmt: skip
        for k, i in enumerate(keep):
            alone, neither = probs[k], probs[len(keep) + k]
            shift[i] = None if alone is None or neither is None else flow_shift(alone, neither)
            if check.rejects(shift[i]):
                out[i] = config.leak_penalty
        keep = [i for i in keep if shift[i] is not None and not check.rejects(shift[i])]  # unmeasured: None
    base = judge(responder, [shown[i] for i in keep], [None] * len(keep), config.mode)
    ours = judge(responder, [shown[i] for i in keep], [states[i].rules for i in keep], config.mode)
    credit = config.answer_flow_check and config.answer_flow_credit
    for i, b, o in zip(keep, base, ours, strict=True):
        if b is not None and o is not None:
            out[i] = credited_gain(o.score - b.score, shift[i]) if credit else o.score - b.score
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=None, help="B: prompts per step (default 16; --smoke: 2)")
    parser.add_argument(
        "--generations", type=int, default=None, help="G: candidates per prompt (default 8; --smoke: 4)"
    )
    parser.add_argument("--out", default=None, help="default: benchmarks/results/bench_reward.json (--smoke: in /tmp)")
    parser.add_argument("--smoke", action="store_true", help="seconds, the same code: see the module docstring")
    args = parser.parse_args()
    args.prompts = args.prompts or (2 if args.smoke else 16)
    args.generations = args.generations or (4 if args.smoke else 8)
    args.out = args.out or default_out("bench_reward.json", args.smoke)

    train_config = yaml.safe_load((ROOT / "configs" / "train" / "tiny_cpu.yaml").read_text())
    if args.smoke:
        train_config |= {"format_warmup_steps": 1, "max_completion_length": 32}
    with tempfile.TemporaryDirectory() as tmp:
        models = build_tiny_models(Path(tmp) / "models")
        config = load_data_config(ROOT / "configs" / "data" / "fever_fixture.yaml", progress=False)
        build_data(config, Path(tmp) / "data")
        train = load_split(Path(tmp) / "data", "train")
        start = time.perf_counter()
        policy = format_warmup(
            str(models["policy"]),
            train,
            Path(tmp) / "warm",
            steps=train_config["format_warmup_steps"],
            learning_rate=train_config["format_warmup_learning_rate"],
            lr_scheduler_type=train_config.get("format_warmup_lr_scheduler_type", "linear"),
            seed=train_config["seed"],
            use_cpu=True,
        )
        warmup_s = time.perf_counter() - start
        instances = train[: args.prompts]
        start = time.perf_counter()
        rows, texts = sample_candidates(
            policy, instances, args.generations, train_config["max_completion_length"], train_config["seed"]
        )
        sampling_s = time.perf_counter() - start
        if args.smoke:  # something past the gates, and a repeat for dedup (the sampled states are all ill-formed)
            for inst in instances:
                rows += [inst, inst]
                texts += [SMOKE_STATE, SMOKE_STATE]
        columns = {k: [r.to_dict()[k] for r in rows] for k in rows[0].to_dict()}
        inner = TransformersResponder(str(models["responder"]), batch_size=32)
        results: dict = {
            **({"smoke": True} if args.smoke else {}),
            "machine": {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
            },
            "step": {"prompts": len(instances), "generations": args.generations, "completions": len(rows)},
            "policy": {
                "model": "tiny random policy (memstate tiny-models) after the format warm-up",
                "warmup_steps": train_config["format_warmup_steps"],
                "warmup_learning_rate": train_config["format_warmup_learning_rate"],
                "warmup_instances": len(train),
                "sampling": {
                    "temperature": 1.0,
                    "top_k": 0,
                    "top_p": 1.0,
                    "max_new_tokens": train_config["max_completion_length"],
                },
                "warmup_seconds": round(warmup_s, 1),
                "sampling_seconds": round(sampling_s, 1),
            },
            "candidates": candidate_figures(rows, texts),
        }
        for mode in ("likelihood", "exact"):
            ours = CountingResponder(inner)
            reward = CounterfactualGainReward(ours, RewardConfig(mode=mode))
            start = time.perf_counter()
            logged: dict[str, float] = {}
            got = reward(prompts=[None] * len(rows), completions=texts, log_metric=logged.__setitem__, **columns)
            ours_s = time.perf_counter() - start
            # the reward's own count of repeats it did not send agrees with what the candidates hold
            assert logged["memstate/dedup_hits"] == results["candidates"]["responder_prompts_saved_by_dedup"]
            first_step = {"responder_prompts": ours.prompts, "prompt_tokens": ours.tokens, "seconds": round(ours_s, 3)}
            # of those prompts, the answer-flow check's (each distinct state alone, each distinct request with neither),
            # and the states it rejected (completions)
            first_step["answer_flow_prompts"] = round(logged["memstate/answer_flow_calls"])
            first_step["answer_flow_rejected"] = round(logged["memstate/answer_flow_rejects"] * len(rows))
            start = time.perf_counter()
            reward(prompts=[None] * len(rows), completions=texts, **columns)  # next step: baselines cached
            warm_s = time.perf_counter() - start
            naive = CountingResponder(inner)
            start = time.perf_counter()
            expected = naive_reward(naive, rows, texts, reward.config)
            naive_s = time.perf_counter() - start
            # the same reward, completion by completion (None: unscorable, on both sides)
            same = [
                (a is None) == (b is None) and (a is None or abs(a - b) < 1e-5)
                for a, b in zip(got, expected, strict=True)
            ]
            assert all(same), f"{mode}: the reward {got} is not the naive one {expected}"
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
