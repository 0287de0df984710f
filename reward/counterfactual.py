"""The TRL reward function: counterfactual answer gain of a reasoning state, with format and leak gates.

    gain_i = Score(A(q, M_q, Z_i), y*) − Score(A(q, M_q), y*)        R_i = gain_i − shift(Z_i)

The dataset rows carry the Instance fields as columns; TRL passes them to the reward function as lists. A call is a
pipeline of named stages, one method each, timed per call (``memstate/time/<stage>``):

- ``fit``: each instance fitted to the responder's context (``memstate.reward.fit``: facts dropped from the end of a
  prompt too long for it, the same facts with and without a state; counted as ``responder_facts_cut``);
- ``format_gate``, then ``leak_gate`` (``memstate.leak``; no responder call for a gated state);
- ``answer_flow``: each distinct passing (instance, state) scored with no memory shown
  (``memstate.reward.answer_flow``), on by default: above the threshold the state scores like a leak;
- ``baselines``: cache first, keyed by a hash of the exact no-state request and the responder's identity, not by
  instance id (``memstate.reward.cache``);
- ``score``: one with-state prompt per distinct (instance, state) still standing → its gain;
- ``credit``: the reward, ``credited_gain`` (the gain less the state's no-memory shift: a state is paid only for what
  it changes through the memories, with no cliff below the threshold);
- ``audit``: every completion's gate decision and reason, the shift, the scores, the gain and the credited reward to
  TRL's completions table (``log_extra``), to a per-step Parquet file given an ``AuditLog`` (``memstate.reward.audit``),
  and to the validation rows while the trainer validates.

A completion whose state, baseline or no-memory (answer-flow) measure the responder could not score gets ``None``,
which TRL leaves out of the advantage: a state whose answer flow was not measured is never paid. With
``round_deadline`` a served responder gets one time budget per call over all its passes, and once a pass fails (no
reply at all, or the budget spent) the later ones are not started (``memstate/round_failed``). The count is logged,
and with a ``guard`` (``memstate.reward.failure.UnscorableGuard``) a call whose share
of them is too high, too many rounds in a row, raises ``ResponderFailure`` before its round trains.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from contextlib import contextmanager
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
        default=True,
        metadata={"help": "Score each state that passed the gates with no memory shown (reward/answer_flow.py): one "
                  "whose shift exceeds answer_flow_threshold gets leak_penalty, and (answer_flow_credit) every other "
                  "one's shift is taken off its gain. Off only where the responder's no-memory answer means nothing "
                  "(a random-init responder: configs/train/tiny_cpu.yaml says so)."},
    )  # fmt: skip
    answer_flow_credit: bool = field(
        default=True,
        metadata={"help": "With answer_flow_check: reward = gain - shift (credited_gain), so a state is paid only for "
                  "what it changes through the memories, with no cliff below the threshold. False: the hard "
                  "threshold alone (a state just under it keeps the answer content it carries)."},
    )  # fmt: skip
    answer_flow_threshold: float = field(
        default=DEFAULT_THRESHOLD,
        metadata={
            "help": "Largest rise of a candidate's probability a state may cause alone; calibrate it per responder "
            "(benchmarks/calibrate_answer_flow.py)."
        },
    )
    round_deadline: float | None = field(
        default=None,
        metadata={
            "help": "Seconds one call (a generation round) may wait on a served responder in all, over its passes "
            "(fitting, answer flow, baselines, scoring); past it every request gives up and what is left is "
            "unscorable. None: each request's own deadline only."
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
        """The named stages, in order, each timed (``memstate/time/<stage>``, seconds of this call)."""
        timers = _Timers()
        batch = _Batch.of(completions, completion_ids, columns)
        budget = _RoundBudget(self.responder, self.config.round_deadline)
        with timers("fit"), budget():
            self._fit(batch)
        with timers("format_gate"):
            self._format_gate(batch)
        with timers("leak_gate"):
            self._leak_gate(batch)
        # The passes that wait on the responder: once one failed (no reply at all, or the round's budget spent),
        # the later ones are not started: what they would score is unscorable.
        with timers("answer_flow"), budget():
            self._answer_flow(batch)
        if not self._round_failed(batch, budget, "answer_flow"):
            with timers("baselines"), budget():
                batch.base = self._baselines(batch.shown)
            if batch.to_score and not batch.base:
                batch.failed = "baselines: no reply"
        if self._round_failed(batch, budget, "baselines"):
            self._score(batch, skip=True)  # counts what is unscorable; sends nothing
        else:
            with timers("score"), budget():
                self._score(batch)
        with timers("credit"):
            self._credit(batch)
        with timers("audit"):
            self._audit(batch, log_extra, trainer_state)
        if log_metric is not None:
            self._metrics(batch, log_metric, timers.seconds)
        self.unscorable += batch.n_unscorable
        self.facts_cut += batch.n_facts_cut
        if self.guard is not None:  # every rank, every call (a collective); raises before this round trains
            self.guard.observe(batch.n_needed, batch.n_unscorable, getattr(self.responder, "last_error", None))
        return batch.reward

    def _fit(self, b: _Batch) -> None:
        """What the responder is shown: facts dropped from the end of a prompt too long for its context, the same
        facts with and without a state. The gates read the instances as built."""
        b.shown = fit_to_responder(self.responder, b.instances)
        b.n_facts_cut = facts_cut(b.instances, b.shown)
        b.hits_before, b.prompts_before = self.cache.hits, self.responder_prompts

    def _format_gate(self, b: _Batch) -> None:
        stops = self.stop_token_ids
        b.parsed = [parse_completion(t, cut_off=cut_off(i, stops)) for t, i in zip(b.texts, b.ids, strict=True)]
        for i, state in enumerate(b.parsed):
            if isinstance(state, FormatError):
                b.reject(i, "format", state.reason, self.config.format_penalty)

    def _leak_gate(self, b: _Batch) -> None:
        """The word rules (``memstate.leak``), once per distinct (instance, state); the survivors are grouped so the
        responder reads each distinct pair once."""
        reasons: dict[tuple[str, str], str | None] = {}
        for i, (inst, state) in enumerate(zip(b.instances, b.parsed, strict=True)):
            if b.gate[i] != "ok":
                continue
            pair = (inst.id, state.text)
            if pair not in reasons:
                reasons[pair] = instance_leak_reason(state.text, inst)
            if reasons[pair] is not None:
                b.reject(i, "leak", reasons[pair], self.config.leak_penalty)
            else:
                b.to_score.setdefault(pair, []).append(i)
        b.n_dedup = sum(len(v) - 1 for v in b.to_score.values())

    def _answer_flow(self, b: _Batch) -> None:
        """Each distinct passing state once, with no memory shown (``memstate.reward.answer_flow``): its shift is
        recorded for the credit, and a state above the threshold is rejected as a leak."""
        if not (self.config.answer_flow_check and b.to_score):
            return
        calls_before = self.answer_flow.calls
        pairs = list(b.to_score)
        measured = self.answer_flow.shifts(
            [b.shown[b.to_score[p][0]] for p in pairs], [b.parsed[b.to_score[p][0]].rules for p in pairs]
        )
        b.flow_calls = self.answer_flow.calls - calls_before
        self.responder_prompts += b.flow_calls
        if measured and all(shift is None for shift in measured):
            b.failed = "answer_flow: no reply"
        for pair, shift in zip(pairs, measured, strict=True):
            idx = b.to_score[pair]
            for i in idx:
                b.shift[i] = shift
            if shift is None:  # unverified: never paid (reward None), counted as unscorable
                b.n_flow_unscorable += len(idx)
                del b.to_score[pair]
            elif self.answer_flow.rejects(shift):
                for i in idx:
                    b.reject(i, "answer_flow", f"answer-flow shift {shift:.3f} > {self.answer_flow.threshold:g}",
                             self.config.leak_penalty)  # fmt: skip
                b.n_flow_rejects += len(idx)
                del b.to_score[pair]

    def _round_failed(self, b: _Batch, budget: _RoundBudget, after: str) -> bool:
        """Whether the passes after ``after`` are skipped: one failed, or the round's budget is spent."""
        if not b.failed and budget.spent():
            b.failed = f"{after}: the {self.config.round_deadline:g} s round deadline passed"
        return b.failed is not None

    def _score(self, b: _Batch, skip: bool = False) -> None:
        """One with-state responder prompt per distinct (instance, state) still standing; gain = its score minus the
        no-state baseline's. Completions whose answer-flow measure failed are unscorable too, and with ``skip`` (an
        earlier pass failed) all of them, with no prompt sent."""
        # completions whose reward needs the responder
        b.n_needed = sum(len(idx) for idx in b.to_score.values()) + b.n_flow_unscorable
        groups = [] if skip else [idx for (inst_id, _), idx in b.to_score.items() if inst_id in b.base]
        b.n_unscorable = b.n_needed - sum(len(idx) for idx in groups)
        if not groups:
            return
        self.responder_prompts += len(groups)
        scored = [b.shown[idx[0]] for idx in groups]
        judged = judge(self.responder, scored, [b.parsed[idx[0]].rules for idx in groups], self.config.mode)
        for idx, inst, ours in zip(groups, scored, judged, strict=True):
            if ours is None:
                b.n_unscorable += len(idx)
                continue
            for i in idx:
                b.gain[i] = ours.score - b.base[inst.id].score
                b.with_state[i], b.with_state_correct[i] = ours.score, ours.correct
            b.changed += [ours.answer != b.base[inst.id].answer] * len(idx)

    def _credit(self, b: _Batch) -> None:
        """The credit rule, in one place: a scored state gets its gain, less its no-memory shift when
        ``answer_flow_credit`` (``credited_gain``); a gated one kept its penalty; an unscorable one stays None."""
        credit = self.config.answer_flow_check and self.config.answer_flow_credit
        for i, gain in enumerate(b.gain):
            if gain is not None:
                b.reward[i] = credited_gain(gain, b.shift[i]) if credit else gain

    def _audit(self, b: _Batch, log_extra, trainer_state) -> None:
        audit = {
            "instance_id": [inst.id for inst in b.instances],
            "state": b.texts,
            "gate": b.gate,
            "gate_reason": b.reason,
            "answer_flow_shift": b.shift,
            "baseline_score": [b.base[inst.id].score if inst.id in b.base else None for inst in b.instances],
            "with_state_score": b.with_state,
            "gain": b.gain,
            "reward": b.reward,
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
                    "reward": b.reward[i],
                    "gain": b.gain[i],
                    "answer_flow_shift": b.shift[i],
                    "gate": b.gate[i],
                    "cut_off": isinstance(b.parsed[i], FormatError) and b.parsed[i].reason == CUT_OFF,
                    "baseline_correct": b.base[inst.id].correct if inst.id in b.base else None,
                    "with_state_correct": b.with_state_correct[i],
                }
                for i, inst in enumerate(b.instances)
            ]

    def _metrics(self, b: _Batch, log_metric: Callable[[str, float], None], seconds: dict[str, float]) -> None:
        n = len(b.texts)
        gains = [g for g in b.gain if g is not None]
        credited = [r for r, g in zip(b.reward, b.gain, strict=True) if g is not None and r is not None]
        closed = [j.correct for j in b.base.values() if j.correct is not None]
        log_metric("memstate/format_rate", 1 - b.gate.count("format") / n)
        log_metric("memstate/leak_rate", b.gate.count("leak") / n)  # the leak gate only, not answer-flow rejects
        log_metric("memstate/cut_off_rate", sum(r == CUT_OFF for r in b.reason) / n)
        if gains:  # per scored completion: the with-state gain, and the reward it was credited
            log_metric("memstate/gain_mean", sum(gains) / len(gains))
            log_metric("memstate/credited_gain_mean", sum(credited) / len(credited))
        if closed:
            log_metric("memstate/baseline_accuracy", sum(closed) / len(closed))
        if b.changed:
            log_metric("memstate/answer_changed_rate", sum(b.changed) / len(b.changed))
        if self.config.answer_flow_check:
            log_metric("memstate/answer_flow_rejects", b.n_flow_rejects / n)
            log_metric("memstate/answer_flow_calls", float(b.flow_calls))
            log_metric("memstate/answer_flow_unscorable", float(b.n_flow_unscorable))
            measured = [s for s in b.shift if s is not None]  # per completion: a repeated state weighs more
            if measured:
                log_metric("memstate/answer_flow_shift_mean", sum(measured) / len(measured))
                log_metric("memstate/answer_flow_shift_p90", quantile(measured, 0.9))
                log_metric("memstate/answer_flow_shift_max", max(measured))
        log_metric("memstate/responder_prompts", float(self.responder_prompts - b.prompts_before))
        log_metric("memstate/dedup_hits", float(b.n_dedup))
        log_metric("memstate/cache_hits", float(self.cache.hits - b.hits_before))
        log_metric("memstate/unscorable", float(b.n_unscorable))
        log_metric("memstate/round_failed", float(b.failed is not None))  # a responder pass failed, later ones skipped
        log_metric("memstate/responder_facts_cut", float(b.n_facts_cut))
        for stage, secs in seconds.items():
            log_metric(f"memstate/time/{stage}", secs)


def credited_gain(gain: float, shift: float | None) -> float:
    """The reward of a state that passed every gate: its gain less what it does with no memory shown.

    ``shift`` is the answer-flow check's label-blind measure (``memstate.reward.answer_flow.flow_shift``): the
    largest share of a candidate's headroom the state fills alone, which for a state that decides a fraction ``f``
    of the answers by itself is ``f`` (for any candidate the no-memory responder gives at most even odds). Such a
    state gains at most ``f`` with the memories too, so its expected credit is at most 0 at any strength: the credit
    never rises with the answer content a state carries. A state that lowers every candidate alone (free text) is
    not paid for it; an unmeasured shift (``None``: the responder failed) takes nothing off.

    >>> credited_gain(0.30, 0.002), credited_gain(0.12, 0.15), credited_gain(0.2, None), credited_gain(0.1, -0.3)
    (0.298, -0.03, 0.2, 0.1)
    """
    return gain if shift is None else round(gain - max(shift, 0.0), 12)


class _RoundBudget:
    """``RewardConfig.round_deadline`` over one call's responder passes: each pass runs inside the responder's
    ``round_deadline`` with what is left (time in the gates between passes is not counted). Responders without it
    (in-process) are not bounded."""

    def __init__(self, responder: Responder, seconds: float | None):
        self.limit = getattr(responder, "round_deadline", None)
        self.left = seconds if self.limit is not None else None
        self.name = f"the {seconds:g} s round deadline" if seconds is not None else None

    @contextmanager
    def __call__(self):
        if self.left is None:
            yield
            return
        start = time.monotonic()
        try:
            with self.limit(max(self.left, 0.0), self.name):
                yield
        finally:
            self.left -= time.monotonic() - start

    def spent(self) -> bool:
        return self.left is not None and self.left <= 0


class _Timers:
    """Seconds per named stage of one reward call."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start


@dataclass
class _Batch:
    """One reward call's completions and what each stage found of them (one entry per completion)."""

    instances: list[Instance]
    texts: list[str]
    ids: list
    shown: list[Instance] = field(default_factory=list)
    parsed: list = field(default_factory=list)
    gate: list[str] = field(default_factory=list)
    reason: list[str | None] = field(default_factory=list)
    reward: list[float | None] = field(default_factory=list)
    gain: list[float | None] = field(default_factory=list)
    shift: list[float | None] = field(default_factory=list)
    with_state: list[float | None] = field(default_factory=list)
    with_state_correct: list[bool | None] = field(default_factory=list)
    to_score: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (instance id, state) -> completions
    base: dict[str, Judgement] = field(default_factory=dict)
    changed: list[bool] = field(default_factory=list)
    n_facts_cut: int = 0
    n_dedup: int = 0
    n_needed: int = 0
    n_unscorable: int = 0
    n_flow_rejects: int = 0
    n_flow_unscorable: int = 0
    failed: str | None = None  # the responder pass that failed this call (later passes skipped), if one did
    flow_calls: int = 0
    hits_before: int = 0
    prompts_before: int = 0

    @classmethod
    def of(cls, completions: list, completion_ids: list | None, columns: dict[str, list]) -> _Batch:
        n = len(completions)
        b = cls(rows_to_instances(n, columns), [completion_text(c) for c in completions],
                completion_ids if completion_ids is not None else [None] * n)  # fmt: skip
        b.gate, b.reason = ["ok"] * n, [None] * n
        b.reward, b.gain, b.shift, b.with_state, b.with_state_correct = ([None] * n for _ in range(5))
        return b

    def reject(self, i: int, gate: str, reason: str, penalty: float) -> None:
        self.gate[i], self.reason[i], self.reward[i] = gate, reason, penalty
