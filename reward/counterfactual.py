"""The TRL reward function: counterfactual answer gain of a reasoning state, with format and leak gates.

    R_i = Score(A(q, M_q, Z_i), y*) − Score(A(q, M_q), y*)

The dataset rows carry the Instance fields as columns; TRL passes them to the reward function as lists.
Order of work per call: gates (no responder call for a gated state) → baselines (cache first, keyed by a hash of
the exact no-state request and the responder's identity, not by instance id: see memstate.reward.cache) → one responder
prompt per distinct (instance, state) → gains. A completion whose state or baseline the responder could not
score gets ``None``, which TRL leaves out of the advantage; training goes on and the count is logged.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field, fields

from memstate.reward.cache import BaselineCache, CacheKey, baseline_key
from memstate.reward.judge import MODES, Judgement, judge

from memstate.leak import leaks_answer
from memstate.responder import Responder
from memstate.rules import CUT_OFF, FormatError, parse_completion
from memstate.schema import Instance

INSTANCE_FIELDS = tuple(f.name for f in fields(Instance))


@dataclass
class RewardConfig:
    """How completions are rewarded."""

    mode: str = field(default="likelihood", metadata={"help": "Score mode: 'likelihood' (dense) or 'exact'."})
    format_penalty: float = field(default=-1.0, metadata={"help": "Reward of a state that fails parse_state."})
    leak_penalty: float = field(default=-1.0, metadata={"help": "Reward of a state that contains the answer."})

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"reward mode {self.mode!r} is not one of {list(MODES)}")


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
    # TRL repeats each prompt's columns G times: build and validate each instance once.
    built: dict[str, Instance] = {}
    for i in range(n):
        if columns["id"][i] not in built:
            built[columns["id"][i]] = Instance.from_dict({k: columns[k][i] for k in INSTANCE_FIELDS}, f"reward row {i}")
    return [built[columns["id"][i]] for i in range(n)]


def cut_off(ids: list[int] | None, stop_token_ids: Collection[int]) -> bool:
    """Whether a completion hit the token limit instead of ending: TRL's own test (``mask_truncated_completions``),
    its last token is not an end-of-sequence (or pad) id.

    >>> cut_off([5, 9, 2], {2}), cut_off([5, 9, 7], {2}), cut_off([5, 9, 7], set())
    (False, True, False)
    """
    return bool(stop_token_ids) and bool(ids) and ids[-1] not in stop_token_ids


class CounterfactualGainReward:
    """A TRL reward function (``prompts, completions, completion_ids, **columns``) -> one float or None each.

    With ``stop_token_ids`` (the trainer's end-of-sequence and pad ids) a completion cut off at
    ``max_completion_length`` fails the format gate whatever its text (``memstate.rules.parse_completion``).
    """

    def __init__(
        self,
        responder: Responder,
        config: RewardConfig | None = None,
        cache: BaselineCache | None = None,
        stop_token_ids: Collection[int] = (),
    ):
        self.responder = responder
        self.config = config or RewardConfig()
        self.cache = cache if cache is not None else BaselineCache()
        self.stop_token_ids = frozenset(stop_token_ids)
        self.responder_prompts = 0  # prompts sent to the responder, baselines included
        self.unscorable = 0  # completions rewarded None

    def _key(self, instance: Instance) -> CacheKey:
        # The exact request and the responder's identity, not the instance id: ids survive dataset rebuilds.
        return baseline_key(instance, self.config.mode, self.responder.identity)

    def baselines(self, instances: list[Instance]) -> dict[str, Judgement]:
        """No-state judgements per instance id (cache first); an instance the responder failed on is absent."""
        keys = {inst.id: (inst, self._key(inst)) for inst in instances}
        cached = self.cache.get_many([key for _, key in keys.values()])
        out = {key.instance_id: j for key, j in cached.items()}
        todo = [(inst, key) for inst, key in keys.values() if inst.id not in out]
        if todo:
            self.responder_prompts += len(todo)
            fresh = judge(self.responder, [inst for inst, _ in todo], [None] * len(todo), self.config.mode)
            scored = {key: j for (_, key), j in zip(todo, fresh, strict=True) if j is not None}
            self.cache.put_many(scored)  # failures are not cached: they are retried next time
            out |= {key.instance_id: j for key, j in scored.items()}
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
        hits_before, prompts_before = self.cache.hits, self.responder_prompts
        ids = completion_ids if completion_ids is not None else [None] * n
        parsed = [
            parse_completion(completion_text(c), cut_off=cut_off(i, self.stop_token_ids))
            for c, i in zip(completions, ids, strict=True)
        ]
        rewards: list[float | None] = [None] * n
        to_score: dict[tuple[str, str], list[int]] = {}  # (instance id, state text) -> completion indices
        n_format = n_leak = 0
        n_cut = sum(isinstance(p, FormatError) and p.reason == CUT_OFF for p in parsed)
        for i, (inst, state) in enumerate(zip(instances, parsed, strict=True)):
            if isinstance(state, FormatError):
                rewards[i] = self.config.format_penalty
                n_format += 1
            elif leaks_answer(state.text, inst):
                rewards[i] = self.config.leak_penalty
                n_leak += 1
            else:
                to_score.setdefault((inst.id, state.text), []).append(i)

        # Baselines for every instance in the batch (cached after the first time): they give the gain and the
        # logged baseline accuracy even when all of an instance's states were gated.
        base = self.baselines(instances)
        groups = [idx for (inst_id, _), idx in to_score.items() if inst_id in base]
        n_unscorable = sum(len(idx) for (inst_id, _), idx in to_score.items() if inst_id not in base)
        changed = []
        if groups:
            self.responder_prompts += len(groups)
            scored_instances = [instances[idx[0]] for idx in groups]
            with_state = judge(
                self.responder, scored_instances, [parsed[idx[0]].rules for idx in groups], self.config.mode
            )
            for idx, inst, ours in zip(groups, scored_instances, with_state, strict=True):
                if ours is None:
                    n_unscorable += len(idx)
                    continue
                for i in idx:
                    rewards[i] = ours.score - base[inst.id].score
                changed += [ours.answer != base[inst.id].answer] * len(idx)
        self.unscorable += n_unscorable

        if log_metric is not None:
            gains = [rewards[i] for idx in groups for i in idx if rewards[i] is not None]
            closed = [j.correct for j in base.values() if j.correct is not None]
            log_metric("memstate/format_rate", 1 - n_format / n)
            log_metric("memstate/leak_rate", n_leak / n)
            log_metric("memstate/cut_off_rate", n_cut / n)
            if gains:
                log_metric("memstate/gain_mean", sum(gains) / len(gains))
            if closed:
                log_metric("memstate/baseline_accuracy", sum(closed) / len(closed))
            if changed:
                log_metric("memstate/answer_changed_rate", sum(changed) / len(changed))
            log_metric("memstate/responder_prompts", float(self.responder_prompts - prompts_before))
            log_metric("memstate/dedup_hits", float(sum(len(v) - 1 for v in to_score.values())))
            log_metric("memstate/cache_hits", float(self.cache.hits - hits_before))
            log_metric("memstate/unscorable", float(n_unscorable))
        return rewards
