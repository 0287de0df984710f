"""The TRL reward function: counterfactual answer gain of a reasoning state, with format and leak gates.

    R_i = Score(A(q, M_q, Z_i), y*) − Score(A(q, M_q), y*)

The dataset rows carry the Instance fields as columns; TRL passes them to the reward function as lists.
Order of work per call: each instance fitted to the responder's context (``memstate.reward.fit``: facts dropped from
the end of a prompt too long for it, the same facts with and without a state; counted as ``responder_facts_cut``) →
format gate → leak gate (no responder call for a gated state) → answer-flow check of each
distinct passing (instance, state), when on (``memstate.reward.answer_flow``: a state that moves the responder's
answer with no memory shown carries the answer, and scores like a leak) → baselines (cache first, keyed by a hash of
the exact no-state request and the responder's identity, not by instance id: see memstate.reward.cache) → one responder
prompt per distinct (instance, state) still standing → gains. A completion whose state or baseline the responder
could not score gets ``None``, which TRL leaves out of the advantage; the count is logged, and with a ``guard``
(``memstate.reward.failure.UnscorableGuard``) a call whose share of them is too high, too many rounds in a row, raises
``ResponderFailure`` before its round trains.

Every completion's gate decision, its reason, the answer-flow shift and the scores go to TRL's completions table
(``log_extra``) and, given an ``AuditLog``, to a per-step Parquet file (``memstate.reward.audit``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field, fields

from memstate.leak import instance_leak_reason
from memstate.responders import Responder
from memstate.reward.answer_flow import DEFAULT_THRESHOLD, AnswerFlowCache, AnswerFlowCheck, quantile
from memstate.reward.audit import AuditLog
from memstate.reward.cache import BaselineCache, CacheKey, baseline_key
from memstate.reward.failure import UnscorableGuard
from memstate.reward.fit import facts_cut, fit_to_responder
from memstate.reward.responder_score import Judgement, judge, score_mode
from memstate.rules import CUT_OFF, FormatError, parse_completion
from memstate.schema import Instance

INSTANCE_FIELDS = tuple(f.name for f in fields(Instance))


@dataclass
class RewardConfig:
    """How completions are rewarded."""

    mode: str = field(
        default="likelihood",
        metadata={"help": "Score mode: a registered one (memstate.reward.responder_score): 'likelihood' (dense) or "
                  "'exact' built in."},
    )  # fmt: skip
    format_penalty: float = field(default=-1.0, metadata={"help": "Reward of a state that fails parse_state."})
    leak_penalty: float = field(default=-1.0, metadata={"help": "Reward of a state that contains the answer."})
    answer_flow_check: bool = field(
        default=False,
        metadata={"help": "Score each state that passed the gates with no memory shown; one that raises any "
                  "candidate's probability by more than answer_flow_threshold gets leak_penalty."},
    )  # fmt: skip
    answer_flow_threshold: float = field(
        default=DEFAULT_THRESHOLD,
        metadata={
            "help": "Largest rise of a candidate's probability a state may cause alone; calibrate it per responder "
            "(benchmarks/calibrate_answer_flow.py)."
        },
    )

    def __post_init__(self) -> None:
        score_mode(self.mode)  # an unknown mode: ConfigError naming the registered ones
        if not 0.0 <= self.answer_flow_threshold < 1.0:
            raise ValueError(f"answer_flow_threshold must be in [0, 1), got {self.answer_flow_threshold}")


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
    The answer-flow check's probabilities are cached in ``answer_flow_cache``, by default (when the check is on) in
    the baseline cache's SQLite file when it has one. With ``audit`` every call's rows go to that step's Parquet file
    (TRL's ``trainer_state`` gives the step; a call without it writes none).
    """

    def __init__(
        self,
        responder: Responder,
        config: RewardConfig | None = None,
        cache: BaselineCache | None = None,
        stop_token_ids: Collection[int] = (),
        answer_flow_cache: AnswerFlowCache | None = None,
        audit: AuditLog | None = None,
        guard: UnscorableGuard | None = None,
    ):
        self.responder = responder
        self.config = config or RewardConfig()
        self.cache = cache if cache is not None else BaselineCache()
        self.stop_token_ids = frozenset(stop_token_ids)
        if answer_flow_cache is None:  # the baseline cache's file holds the check's table too (only when it is on),
            # opened as the baseline cache is: read-write, or a read-only node-local copy with misses kept in memory
            answer_flow_cache = AnswerFlowCache(
                self.cache.path if self.config.answer_flow_check else None, read_only=self.cache.read_only
            )
        self.answer_flow = AnswerFlowCheck(responder, self.config.answer_flow_threshold, answer_flow_cache)
        self.audit = audit
        self.guard = guard  # observes each call's unscorable share (None: never stops the run)
        # While the trainer validates (``memstate.train.validation``): a list that each call extends with one row per
        # completion (instance, group, reward, gate, correctness with and without the state); None while training.
        self.validation: list[dict] | None = None
        self.responder_prompts = 0  # prompts sent to the responder, baselines and answer-flow checks included
        self.unscorable = 0  # completions rewarded None
        self.facts_cut = 0  # instances shown to the responder with fewer facts (summed over calls)

    def _key(self, instance: Instance) -> CacheKey:
        # The exact request and the responder's identity, not the instance id: ids survive dataset rebuilds.
        return baseline_key(instance, self.config.mode, self.responder.identity)

    def baselines(self, instances: list[Instance]) -> dict[str, Judgement]:
        """No-state judgements per instance id (cache first); an instance the responder failed on is absent. The
        instances are fitted to the responder's context first (``memstate.reward.fit``; a fitted one stays as it is),
        so a key describes the request sent, whoever calls (training, ``precompute-baselines``)."""
        return self._baselines(fit_to_responder(self.responder, instances))

    def _baselines(self, instances: list[Instance]) -> dict[str, Judgement]:
        """``baselines`` of instances already fitted to the responder's context."""
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
        log_extra: Callable[[str, list], None] | None = None,
        trainer_state=None,
        **columns,
    ) -> list[float | None]:
        n = len(completions)
        instances = rows_to_instances(n, columns)
        # What the responder is shown: facts dropped from the end of a prompt too long for its context, the same
        # facts with and without a state. The gates read the instances as built.
        shown = fit_to_responder(self.responder, instances)
        n_facts_cut = facts_cut(instances, shown)
        self.facts_cut += n_facts_cut
        hits_before, prompts_before = self.cache.hits, self.responder_prompts
        ids = completion_ids if completion_ids is not None else [None] * n
        texts = [completion_text(c) for c in completions]
        parsed = [parse_completion(t, cut_off=cut_off(i, self.stop_token_ids)) for t, i in zip(texts, ids, strict=True)]
        rewards: list[float | None] = [None] * n
        gate, reason = ["ok"] * n, [None] * n
        shifts: list[float | None] = [None] * n
        with_state: list[float | None] = [None] * n
        to_score: dict[tuple[str, str], list[int]] = {}  # (instance id, state text) -> completion indices
        leak_reasons: dict[tuple[str, str], str | None] = {}  # the gate once per distinct (instance, state)
        n_format = n_leak = 0
        n_cut = sum(isinstance(p, FormatError) and p.reason == CUT_OFF for p in parsed)
        for i, (inst, state) in enumerate(zip(instances, parsed, strict=True)):
            if isinstance(state, FormatError):
                rewards[i], gate[i], reason[i] = self.config.format_penalty, "format", state.reason
                n_format += 1
                continue
            pair = (inst.id, state.text)
            if pair not in leak_reasons:
                leak_reasons[pair] = instance_leak_reason(state.text, inst)
            if leak_reasons[pair] is not None:
                rewards[i], gate[i], reason[i] = self.config.leak_penalty, "leak", leak_reasons[pair]
                n_leak += 1
            else:
                to_score.setdefault(pair, []).append(i)
        n_dedup = sum(len(v) - 1 for v in to_score.values())

        # Answer flow: each distinct passing state once, with no memory shown; a rejected one is not scored further.
        flow_calls = n_flow_rejects = n_flow_unscorable = 0
        if self.config.answer_flow_check and to_score:
            calls_before = self.answer_flow.calls
            pairs = list(to_score)
            measured = self.answer_flow.shifts(
                [shown[to_score[p][0]] for p in pairs], [parsed[to_score[p][0]].rules for p in pairs]
            )
            flow_calls = self.answer_flow.calls - calls_before
            self.responder_prompts += flow_calls
            for pair, shift in zip(pairs, measured, strict=True):
                idx = to_score[pair]
                for i in idx:
                    shifts[i] = shift
                if shift is None:
                    n_flow_unscorable += len(idx)
                elif self.answer_flow.rejects(shift):
                    for i in idx:
                        rewards[i], gate[i] = self.config.leak_penalty, "answer_flow"
                        reason[i] = f"answer-flow shift {shift:.3f} > {self.answer_flow.threshold:g}"
                    n_flow_rejects += len(idx)
                    del to_score[pair]

        # Baselines for every instance in the batch (cached after the first time): they give the gain and the
        # logged baseline accuracy even when all of an instance's states were gated.
        n_needed = sum(len(idx) for idx in to_score.values())  # completions whose reward needs the responder
        base = self._baselines(shown)  # fitted above
        groups = [idx for (inst_id, _), idx in to_score.items() if inst_id in base]
        n_unscorable = sum(len(idx) for (inst_id, _), idx in to_score.items() if inst_id not in base)
        changed = []
        with_state_correct: list[bool | None] = [None] * n
        if groups:
            self.responder_prompts += len(groups)
            scored_instances = [shown[idx[0]] for idx in groups]
            judged = judge(self.responder, scored_instances, [parsed[idx[0]].rules for idx in groups], self.config.mode)
            for idx, inst, ours in zip(groups, scored_instances, judged, strict=True):
                if ours is None:
                    n_unscorable += len(idx)
                    continue
                for i in idx:
                    rewards[i] = ours.score - base[inst.id].score
                    with_state[i], with_state_correct[i] = ours.score, ours.correct
                changed += [ours.answer != base[inst.id].answer] * len(idx)
        self.unscorable += n_unscorable

        audit = {
            "instance_id": [inst.id for inst in instances],
            "state": texts,
            "gate": gate,
            "gate_reason": reason,
            "answer_flow_shift": shifts,
            "baseline_score": [base[inst.id].score if inst.id in base else None for inst in instances],
            "with_state_score": with_state,
            "reward": rewards,
        }
        if log_extra is not None:  # TRL's completions table already holds the state (completion) and the reward
            for column, values in audit.items():
                if column not in ("state", "reward"):
                    log_extra(column, list(values))
        if self.audit is not None and trainer_state is not None:
            rows = [dict(zip(audit, values, strict=True)) for values in zip(*audit.values(), strict=True)]
            # Training completions train the next optimizer step; validation ones are of the step just taken.
            self.audit.write(trainer_state.global_step + (self.validation is None), rows)
        if self.validation is not None:
            self.validation += [
                {
                    "instance_id": inst.id,
                    "group": inst.meta.get("group", inst.id),
                    "reward": rewards[i],
                    "gate": gate[i],
                    "cut_off": isinstance(parsed[i], FormatError) and parsed[i].reason == CUT_OFF,
                    "baseline_correct": base[inst.id].correct if inst.id in base else None,
                    "with_state_correct": with_state_correct[i],
                }
                for i, inst in enumerate(instances)
            ]

        if log_metric is not None:
            gains = [rewards[i] for idx in groups for i in idx if rewards[i] is not None]
            closed = [j.correct for j in base.values() if j.correct is not None]
            log_metric("memstate/format_rate", 1 - n_format / n)
            log_metric("memstate/leak_rate", n_leak / n)  # the leak gate (memstate.leak) only, not answer-flow rejects
            log_metric("memstate/cut_off_rate", n_cut / n)
            if gains:
                log_metric("memstate/gain_mean", sum(gains) / len(gains))
            if closed:
                log_metric("memstate/baseline_accuracy", sum(closed) / len(closed))
            if changed:
                log_metric("memstate/answer_changed_rate", sum(changed) / len(changed))
            if self.config.answer_flow_check:
                log_metric("memstate/answer_flow_rejects", n_flow_rejects / n)
                log_metric("memstate/answer_flow_calls", float(flow_calls))
                log_metric("memstate/answer_flow_unscorable", float(n_flow_unscorable))
                measured_shifts = [s for s in shifts if s is not None]  # per completion: a repeated state weighs more
                if measured_shifts:
                    log_metric("memstate/answer_flow_shift_mean", sum(measured_shifts) / len(measured_shifts))
                    log_metric("memstate/answer_flow_shift_p90", quantile(measured_shifts, 0.9))
                    log_metric("memstate/answer_flow_shift_max", max(measured_shifts))
            log_metric("memstate/responder_prompts", float(self.responder_prompts - prompts_before))
            log_metric("memstate/dedup_hits", float(n_dedup))
            log_metric("memstate/cache_hits", float(self.cache.hits - hits_before))
            log_metric("memstate/unscorable", float(n_unscorable))
            log_metric("memstate/responder_facts_cut", float(n_facts_cut))
        if self.guard is not None:  # every rank, every call (a collective); raises before this round trains
            self.guard.observe(n_needed, n_unscorable, getattr(self.responder, "last_error", None))
        return rewards
