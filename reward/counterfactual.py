"""The TRL reward function: counterfactual answer gain of a reasoning state, with format and leak gates.

    R_i = Score(A(q, M_q, Z_i), y*) − Score(A(q, M_q), y*)

The dataset rows carry the Instance fields as columns; TRL passes them to the reward function as lists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields

from memstate.prompts import PROMPT_VERSION
from memstate.responder import Responder
from memstate.rules import FormatError, State, parse_state
from memstate.schema import Instance
from reward.gates import leaks_answer
from reward.likelihood import Judgement, likelihood_judgements

INSTANCE_FIELDS = tuple(f.name for f in fields(Instance))


@dataclass
class RewardConfig:
    """How completions are rewarded."""

    mode: str = field(default="likelihood", metadata={"help": "Score mode: 'likelihood' (dense). 'exact' comes later."})
    format_penalty: float = field(default=-1.0, metadata={"help": "Reward of a state that fails parse_state."})
    leak_penalty: float = field(default=-1.0, metadata={"help": "Reward of a state that contains the answer."})

    def __post_init__(self) -> None:
        if self.mode != "likelihood":
            raise ValueError(f"reward mode {self.mode!r} is not implemented yet; use 'likelihood'")


class BaselineCache:
    """In-memory cache of no-state judgements, keyed by (instance, responder, prompt version, mode)."""

    def __init__(self) -> None:
        self._store: dict[tuple[str, str, str, str], Judgement] = {}
        self.hits = 0

    def get(self, key: tuple[str, str, str, str]) -> Judgement | None:
        value = self._store.get(key)
        self.hits += value is not None
        return value

    def put(self, key: tuple[str, str, str, str], value: Judgement) -> None:
        self._store[key] = value


def completion_text(completion: str | list[dict]) -> str:
    """The text of a TRL completion: a string, or a list of chat messages (conversational datasets).

    >>> completion_text([{"role": "assistant", "content": "- Use F1."}])
    '- Use F1.'
    """
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in completion if m.get("role") == "assistant")


def rows_to_instances(n: int, columns: dict[str, list]) -> list[Instance]:
    missing = [f for f in INSTANCE_FIELDS if f not in columns]
    if missing:
        raise KeyError(f"reward columns lack Instance field(s) {missing}; was the dataset built by memstate?")
    return [Instance.from_dict({k: columns[k][i] for k in INSTANCE_FIELDS}, f"reward row {i}") for i in range(n)]


class CounterfactualGainReward:
    """A TRL reward function (``prompts, completions, completion_ids, **columns``) -> one float per completion."""

    def __init__(self, responder: Responder, config: RewardConfig | None = None, cache: BaselineCache | None = None):
        self.responder = responder
        self.config = config or RewardConfig()
        self.cache = cache if cache is not None else BaselineCache()

    def _cache_key(self, instance: Instance) -> tuple[str, str, str, str]:
        return (instance.id, self.responder.name, PROMPT_VERSION, self.config.mode)

    def baselines(self, instances: list[Instance]) -> dict[str, Judgement]:
        """No-state judgements per instance id, computed once and cached."""
        out: dict[str, Judgement] = {}
        todo: dict[str, Instance] = {}
        for inst in instances:
            cached = self.cache.get(self._cache_key(inst))
            if cached is not None:
                out[inst.id] = cached
            else:
                todo[inst.id] = inst
        if todo:
            fresh = likelihood_judgements(self.responder, list(todo.values()), [None] * len(todo))
            for inst, judgement in zip(todo.values(), fresh, strict=True):
                self.cache.put(self._cache_key(inst), judgement)
                out[inst.id] = judgement
        return out

    def __call__(
        self,
        prompts: list,
        completions: list,
        completion_ids: list | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        **columns,
    ) -> list[float | None]:
        n = len(completions)
        instances = rows_to_instances(n, columns)
        hits_before = self.cache.hits
        parsed = [parse_state(completion_text(c)) for c in completions]
        rewards: list[float | None] = [None] * n
        to_score: dict[tuple[str, str], list[int]] = {}  # (instance id, state text) -> completion indices
        n_format = n_leak = 0
        for i, (inst, state) in enumerate(zip(instances, parsed, strict=True)):
            if isinstance(state, FormatError):
                rewards[i] = self.config.format_penalty
                n_format += 1
            elif leaks_answer(state.text, inst):
                rewards[i] = self.config.leak_penalty
                n_leak += 1
            else:
                to_score.setdefault((inst.id, state.text), []).append(i)

        # Baselines for every instance in the batch (cached after the first time): they give the gain and
        # the logged baseline accuracy even when all of an instance's states were gated.
        base = self.baselines(list({inst.id: inst for inst in instances}.values()))
        if to_score:
            first = [idx[0] for idx in to_score.values()]
            scored_instances = [instances[i] for i in first]
            states: list[State] = [parsed[i] for i in first]  # type: ignore[misc]
            with_state = likelihood_judgements(self.responder, scored_instances, [s.rules for s in states])
            for idx, inst, judgement in zip(to_score.values(), scored_instances, with_state, strict=True):
                for i in idx:
                    rewards[i] = judgement.score - base[inst.id].score

        if log_metric is not None:
            gains = [rewards[i] for idx in to_score.values() for i in idx]
            closed = [j.correct for j in base.values() if j.correct is not None]
            log_metric("memstate/format_rate", 1 - n_format / n)
            log_metric("memstate/leak_rate", n_leak / n)
            if gains:
                log_metric("memstate/gain_mean", sum(gains) / len(gains))
            if closed:
                log_metric("memstate/baseline_accuracy", sum(closed) / len(closed))
            log_metric("memstate/responder_prompts", float(len(to_score)))
            log_metric("memstate/dedup_hits", float(sum(len(v) - 1 for v in to_score.values())))
            log_metric("memstate/cache_hits", float(self.cache.hits - hits_before))
        return rewards
