"""Answer-flow check: does a reasoning state carry the answer itself, whatever its wording?

The leak gate (``memstate.leak``) reads a state's words; a free-text policy can pass the answer in words no list
foresees. This check measures instead of reading. The responder answers the question and candidates **with the state
but with no memory and no relation at all**, and, once per request, with neither:

    shift(Z) = max over candidates c of [ P(c | q, Z) − P(c | q) ] / max(1 − P(c | q), 1/2)

A rule about memories ("Trust F2 over F1", "Prefer the newer preference") has nothing to act on when no memory is
shown, so it barely moves the answer; a state that moves it alone carries answer content ("go with the one about
Oslo", a paraphrase of an option, a hint at its position) and is penalised as a leak (``leak_penalty``) when its
shift exceeds a threshold, and below it the shift is taken off its reward (``credited_gain``). The shift is the share
of a candidate's headroom the state fills alone (``flow_shift``): for a state that decides a fraction of the answers
by itself, that fraction. The maximum is over **all** candidates, never the gold one's rise: the decision is the same
whatever the gold answer is, so a rejection tells the policy nothing about the label (like the leak gate).

Probabilities are always likelihoods, whatever the reward's score mode: closed sets (``label``, ``choice``) →
P(letter) renormalised over the option letters, from ``Responder.answer_logprob``; free text (no candidates) → the
length-normalised probability of the reference continuation, whose rise is then the shift. That one depends on the
reference (there is no other candidate to compare), as the free-text leak gate depends on the reference span.

Cost: one responder prompt per distinct state, plus one no-memory no-state prompt per distinct request; both are
cached by content (sha256 of the exact request and the responder's ``identity``, as ``reward.cache`` keys baselines),
in memory and, given a path, in a second table of the baseline cache's SQLite file (read-write, or a read-only
node-local copy whose misses stay in memory, as the baseline cache is opened). A state seen again (GRPO repeats
states across steps) costs no call. A request the responder could not answer (``None``) is not cached and gives no
shift: the state is not rejected by this check, and callers count it.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Sequence
from pathlib import Path

from memstate.prompts import PROMPT_VERSION, Message, responder_request_messages
from memstate.responders import ContinuationLogprob, Responder
from memstate.reward.cache import connect, connect_read_only, request_digest
from memstate.reward.score import continuation_probability, option_probability
from memstate.schema import Instance, option_letters

# A rise of 0.2 in one candidate's probability from the state alone. In the sycophancy world no legitimate state came
# near it (largest shift 0.0017 of 2,805); per responder, set it with benchmarks/calibrate_answer_flow.py.
DEFAULT_THRESHOLD = 0.2
HEADROOM_FLOOR = 0.5  # flow_shift divides a rise by the candidate's headroom, never by less than this

_TABLE = "answer_flow_probabilities"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS answer_flow_probabilities (
    digest TEXT PRIMARY KEY,
    instance_id TEXT NOT NULL,
    responder TEXT NOT NULL,
    prompt_version TEXT NOT NULL,
    with_state INTEGER NOT NULL,
    probabilities TEXT NOT NULL
)
"""


def flow_messages(instance: Instance, rules: Sequence[str] | None = None) -> list[Message]:
    """The responder prompt of the check: the question and its candidates, no memory, no relation, the rules if any.

    >>> from memstate.schema import Fact
    >>> inst = Instance("x", "personamem", "preference_update", "none", "Which city?", ("Bergen", "Oslo"), "B",
    ...                 "choice", (), (Fact("F1", "I moved to Oslo.", "fact"),), ())
    >>> text = flow_messages(inst, ("Trust F1.",))[1]["content"]
    >>> text.startswith("Memories:\\n(none)\\n\\nRelations:\\n(none)") and "Oslo." not in text
    True
    """
    return responder_request_messages(instance.question, instance.candidates, (), (), rules)


def flow_continuations(instance: Instance) -> list[str]:
    """What is scored: the option letters of a closed set, else the reference answer (free text)."""
    return option_letters(len(instance.candidates)) if instance.candidates else [instance.answer]


def flow_digest(instance: Instance, rules: Sequence[str] | None, responder_identity: str) -> str:
    """The cache key of one check request: the exact messages and continuations, and the responder's identity."""
    request = {"check": "answer_flow", "messages": flow_messages(instance, rules),
               "continuations": flow_continuations(instance)}  # fmt: skip
    return request_digest({"request": request, "responder": responder_identity})


def candidate_probabilities(logprobs: Sequence[ContinuationLogprob], closed: bool) -> tuple[float, ...]:
    """Closed sets: each letter's probability renormalised over the letters; free text: the reference continuation's
    length-normalised probability (one value).

    >>> lps = [ContinuationLogprob(math.log(0.2), 1), ContinuationLogprob(math.log(0.6), 1)]
    >>> [round(p, 3) for p in candidate_probabilities(lps, closed=True)]
    [0.25, 0.75]
    >>> [round(p, 3) for p in candidate_probabilities([ContinuationLogprob(2 * math.log(0.5), 2)], closed=False)]
    [0.5]
    """
    if not closed:
        return (continuation_probability(*logprobs[0]),)
    values = [lp.logprob for lp in logprobs]
    return tuple(option_probability(values, k) for k in range(len(values)))


def flow_shift(with_state: Sequence[float], without: Sequence[float]) -> float:
    """The largest share of any candidate's headroom the state fills alone: label-blind, it never asks which candidate
    is gold.

        shift = max over c of (P(c | q, Z) − P(c | q)) / max(1 − P(c | q), HEADROOM_FLOOR)

    Why the headroom: a state that decides a fraction ``f`` of the answers by itself (``f`` of them go to its
    candidate whatever the prompt says) raises that candidate by ``f·(1 − P(c | q))``; divided by the headroom, the
    shift is ``f`` itself, which bounds what the state can gain with the memories shown too (at most ``f``), so
    ``reward = gain − shift`` never pays for answer content (``memstate.reward.counterfactual.credited_gain``). The
    raw rise would miss most of it where the responder answers confidently wrong with the memories and unsure
    without them. The floor keeps a candidate the responder already picks with no memory (headroom near 0) from
    turning noise into a large shift: there the measure is the rise over 1/2, and a push toward that candidate is
    what a no-memory check cannot see (docs/reward.md, "What the credit does not close").

    >>> round(flow_shift((0.7, 0.2, 0.1), (0.4, 0.3, 0.3)), 6)   # 0.3 of a headroom of 0.6
    0.5
    >>> round(flow_shift((0.1, 0.2, 0.7), (0.4, 0.3, 0.3)), 6)   # the same push towards another candidate
    0.571429
    >>> round(flow_shift((0.49, 0.51), (0.4, 0.6)), 6)           # 0.15 of the answers decided alone (to A)
    0.15
    >>> round(flow_shift((0.9995, 0.0005), (0.999, 0.001)), 6)  # near-certain candidate: the rise over 1/2
    0.001
    >>> flow_shift((0.5,), (0.5,))
    0.0
    """
    return max((w - o) / max(1.0 - o, HEADROOM_FLOOR) for w, o in zip(with_state, without, strict=True))


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile with linear interpolation between order statistics (numpy's default).

    >>> quantile([0.0, 1.0, 2.0, 3.0, 4.0], 0.9), quantile([3.0], 0.9), quantile([1.0, 2.0], 0.5)
    (3.6, 3.0, 1.5)
    """
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


class AnswerFlowCache:
    """Candidate probabilities by request digest: in memory, and in the SQLite file ``path`` when given (table
    ``answer_flow_probabilities``, next to the baselines; WAL, first value wins), or with ``read_only`` read from a
    file that does not change (the baseline cache's node-local copy), new values kept in memory only.
    ``hits``/``misses`` count lookups."""

    def __init__(self, path: str | Path | None = None, *, read_only: bool = False):
        self.path = Path(path) if path else None
        self.read_only = bool(read_only and self.path)
        self.hits = 0
        self.misses = 0
        self._memory: dict[str, tuple[float, ...]] = {}
        self._unsaved: set[str] = set()  # read-only: digests put here that the file does not hold
        self._lock = threading.Lock()
        self._db = None
        if self.path:
            read_only = self.read_only
            self._db = connect_read_only(self.path, _TABLE) if read_only else connect(self.path, _SCHEMA)

    def get_many(self, digests: Sequence[str]) -> dict[str, tuple[float, ...]]:
        todo = {d for d in digests if d not in self._memory}
        if todo and self._db is not None:
            with self._lock:
                for digest in todo:
                    row = self._db.execute(
                        "SELECT probabilities FROM answer_flow_probabilities WHERE digest=?", (digest,)
                    ).fetchone()
                    if row is not None:
                        self._memory[digest] = tuple(json.loads(row[0]))
        found = {d: self._memory[d] for d in digests if d in self._memory}
        self.hits += len(found)
        self.misses += len(digests) - len(found)
        return found

    def put_many(self, rows: Sequence[tuple[str, str, str, bool, tuple[float, ...]]]) -> None:
        """``rows``: (digest, instance id, responder identity, with a state?, probabilities)."""
        if self.read_only:  # memory only; the first value wins, as in the file
            with self._lock:
                for digest, *_, probs in rows:
                    if digest not in self._memory and not self._in_file(digest):
                        self._memory[digest] = probs
                        self._unsaved.add(digest)
            return
        for digest, *_, probs in rows:
            self._memory.setdefault(digest, probs)
        if self._db is not None and rows:
            values = [(d, i, r, PROMPT_VERSION, int(s), json.dumps(list(p))) for d, i, r, s, p in rows]
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany(
                    "INSERT OR IGNORE INTO answer_flow_probabilities VALUES (?, ?, ?, ?, ?, ?)", values
                )
                self._db.execute("COMMIT")

    def _in_file(self, digest: str) -> bool:
        return self._db is not None and (
            self._db.execute(f"SELECT 1 FROM {_TABLE} WHERE digest=?", (digest,)).fetchone() is not None
        )

    def __len__(self) -> int:
        if self._db is not None:
            with self._lock:
                return self._db.execute(f"SELECT COUNT(*) FROM {_TABLE}").fetchone()[0] + len(self._unsaved)
        return len(self._memory)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


class AnswerFlowCheck:
    """Shifts of (instance, rules) pairs, from cached or fresh responder scores; ``calls`` counts responder prompts
    spent (each distinct request at most once per cache)."""

    def __init__(
        self, responder: Responder, threshold: float = DEFAULT_THRESHOLD, cache: AnswerFlowCache | None = None
    ):
        self.responder = responder
        self.threshold = threshold
        self.cache = cache if cache is not None else AnswerFlowCache()
        self.calls = 0

    def rejects(self, shift: float | None) -> bool:
        """A measured shift above the threshold; an unmeasured one (``None``) is never a rejection."""
        return shift is not None and shift > self.threshold

    def shifts(self, instances: Sequence[Instance], rules: Sequence[Sequence[str]]) -> list[float | None]:
        """One shift per pair; ``None`` where the responder could not score the state's or the no-state request."""
        identity = self.responder.identity
        requests: dict[str, tuple[Instance, tuple[str, ...] | None]] = {}  # digest -> what to ask
        pairs = []
        for inst, r in zip(instances, rules, strict=True):
            ours, none = flow_digest(inst, r, identity), flow_digest(inst, None, identity)
            requests.setdefault(ours, (inst, tuple(r)))
            requests.setdefault(none, (inst, None))
            pairs.append((ours, none))
        probs = self.cache.get_many(list(requests))
        todo = [d for d in requests if d not in probs]
        if todo:
            self.calls += len(todo)
            asked = [requests[d] for d in todo]
            results = self.responder.answer_logprob(
                [flow_messages(inst, r) for inst, r in asked], [flow_continuations(inst) for inst, _ in asked]
            )
            fresh = [
                (d, inst.id, identity, r is not None, candidate_probabilities(lps, bool(inst.candidates)))
                for d, (inst, r), lps in zip(todo, asked, results, strict=True)
                if lps is not None  # a failure is not cached: it is asked again next time
            ]
            self.cache.put_many(fresh)
            probs |= {row[0]: row[-1] for row in fresh}
        return [flow_shift(probs[o], probs[n]) if o in probs and n in probs else None for o, n in pairs]
