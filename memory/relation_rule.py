"""The one relation rule: whether a later statement SUPERSEDES or CONFLICTS_WITH an earlier one.

Every relation the pipeline draws by rule comes from ``relate`` (version ``RELATION_RULE_VERSION``): the PersonaMem
builder (``data_build.personamem``) that the policy learns from, and the extractors that serve it
(``TurnExtractor``, the default of ``memory ingest``, ``eval memsyco`` and ``eval sweep``; ``RuleExtractor``). The
policy is so trained on edges drawn the way it will be shown them. The data manifest and every memory store record
the version. (``LLMExtractor`` proposes its own relations; its store records ``llm:<prompt version>`` instead.)

An edge the policy is trained to trust has to be right far more often than not, so the rule is conservative:

- **SUPERSEDES: a stated change of view** (``rule_extractor.revises``). The later statement says that something
  changed: a strong cue ("no longer", "anymore", "used to", "changed my mind", "change of heart", "rethinking",
  "these days", "from now on", "I'd rather", "I'm done with", "I've stopped/switched/given up", …) counts 2, a weak
  one ("now", "actually", "lately", "prefer", "I want to", "completely", "I've been thinking") 1, questions left
  out; a statement in the first person scoring 2 or more is a revision. On the first half of MemSyco's
  ``valid_memory_selection`` a user turn with "changed my mind", "rethinking", "anymore" or "I'd rather" is the one
  stating the current preference every time, with "used to" 94% of the time, but with "actually" 84%, "lately"
  83%, "now" 65% (they narrate too; on LoCoMo "Been super busy lately"), and with "realized", "decided" or
  "instead" under a third: those are no cues. Two statements that merely resemble each other (the PersonaMem
  builder's old test, cosine ≥ 0.5) are no change: a restatement, or two tastes on one subject.
- **CONFLICTS_WITH: opposite polarity of one claim.** Both are one-sentence claims (``rule_extractor.fact_kind``:
  fact, belief or experience) and exactly one is negated ("I believe X is Y" / "I don't think X is Y"). Polarity
  is a property of a sentence, not of a turn of several (nearly every turn holds a "not" somewhere), so longer
  statements never conflict. A revision is a SUPERSEDES, never a conflict.
- **The same person.** Both statements are the same person's (``person``: a speaker, else the turn's role);
  ``person`` None (an assistant's turn, which states no view of its own) is never related.
- **The same thing.** With vectors (``vecs``, unit rows): cosine ≥ ``COSINE``. Without: at least ``MIN_SHARED``
  topic words (``rule_extractor.topic``) making at least ``MIN_SHARE`` of the smaller statement's topic words
  (whole turns share a few words by chance; a single shared word such as "Boston" is chance).
- **The nearest one, still current.** A later statement relates to the one earlier statement (an earlier turn,
  not superseded yet) most alike (cosine, else shared share): chained changes read C → B → A. A stored fact (``new``
  False) keeps its kind, so it is superseded only when it already is a preference or constraint, and conflicts only
  when it is a claim.

Both ends of a SUPERSEDES state a stance, so a new statement whose cue kind cannot take part in one (an
``experience`` narrating where the old view came from, say) is made a ``preference`` (``stance_kinds``).

Designed on the first 175 rows of ``valid_memory_selection`` (file order), measured by ``memstate.evaluate.relations``
(correct: the current memory's turn SUPERSEDES the outdated one's; the memory items never reach the extractor);
SUPERSEDES drawn / correct, precision, recall (rows with a correct edge):

- turn extractor (the default), shared words: rows 1-175 106 / 97, P 0.92, R 0.55; rows 176-350 101 / 93, P 0.92,
  R 0.53; all 350 207 / 190, P 0.92, R 0.54. No CONFLICTS_WITH (turns are rarely one sentence). Unchanged from the
  turn extractor's rule before this module (the same test).
- turn extractor, MiniLM cosine ≥ 0.55: rows 1-175 133 / 123, P 0.92, R 0.70; rows 176-350 139 / 119, P 0.86, R
  0.68; all 350 272 / 242, P 0.89, R 0.69 (unchanged; below 0.9 on the held-out half: not the default).
- rule extractor, shared words: rows 1-175 2 / 2, P 1.0, R 0.01; rows 176-350 1 / 1; all 350 3 / 3, P 1.0, R 0.01
  (before, its own looser rule: all 350 23 / 10, P 0.43, R 0.03, 7 CONFLICTS_WITH). One sentence seldom shares 4
  topic words with another.
- rule extractor, MiniLM: rows 1-175 28 / 19, P 0.68, R 0.11; rows 176-350 20 / 16, P 0.80, R 0.09; all 350
  48 / 35, P 0.73, R 0.10, and 56 CONFLICTS_WITH, 6 of them between the two items' turns (before: all 350 63 / 12,
  P 0.19, 69 CONFLICTS_WITH). Cosine between single sentences is looser than between turns: not yet trustworthy.

Where the two same-thing tests are used: ``memory ingest``'s default (``memory.extract.make_extractor``: no
embedder), ``eval memsyco`` and ``eval sweep`` use shared words; the PersonaMem builder passes the MiniLM vectors it
computes anyway, so its edges use the cosine test (P 0.92 / 0.86 on the two halves above, against 0.92 / 0.92).
Open: with shared words the hand-written PersonaMem fixtures keep 12 of their 27 edges (hand-written changes seldom
share 4 topic words); whether real PersonaMem changes do cannot be measured here (no PersonaMem data ships).

On LoCoMo's first five conversations (2760 turn facts) the turn extractor drew 3 SUPERSEDES edges with this rule's
SUPERSEDES test, all within one speaker, none a real change of view: rare, not yet right there.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from memstate.memory.records import StoredFact
from memstate.memory.rule_extractor import fact_kind, negated, revises, sentences, topic
from memstate.memory.validate import compatible

RELATION_RULE_VERSION = "relations-v1"
MIN_SHARED = 4
MIN_SHARE = 0.2
COSINE = 0.55  # MiniLM: unrelated statements score about 0-0.2, one person's two views of one thing 0.55 and up
UPDATABLE = frozenset({"preference", "constraint"})
CLAIMS = frozenset({"fact", "belief", "experience"})
Edge = tuple[int, str, int]  # (later, type, earlier): indices into the statements
_LABEL = re.compile(r"(?P<who>.+?)(?: \(.*\))?: ")


def stored_person(fact: StoredFact) -> str | None:
    """Whose view a stored fact states: its speaker; else the name ``TurnExtractor.label`` put before the quote (the
    store keeps speakers but not roles); else ``user`` for a fact that is its quote alone (``RuleExtractor``'s,
    drawn from user turns only); None when none says, or when it was an assistant's.

    >>> from dataclasses import replace
    >>> f = StoredFact("m1", "user (turn 3): I love tea", "preference", "global", "I love tea", "s", 3, "turn 3")
    >>> stored_person(f), stored_person(replace(f, text="I love tea")), stored_person(replace(f, speaker="Ana"))
    ('user', 'user', 'Ana')
    >>> stored_person(replace(f, text="assistant: I love tea")), stored_person(replace(f, text="Loves tea"))
    (None, None)
    """
    if fact.speaker:
        return fact.speaker
    if not fact.quote or not fact.text.endswith(fact.quote):
        return None
    if fact.text == fact.quote:
        return "user"
    m = _LABEL.fullmatch(fact.text[: len(fact.text) - len(fact.quote)])
    return m["who"] if m and m["who"] not in ("assistant", "system") else None


def shared_topic(a: frozenset[str], b: frozenset[str]) -> tuple[int, float]:
    """How many topic words two statements share, and what share of the smaller one's words that is.

    >>> shared_topic(frozenset({"jam", "session", "chaotic"}), frozenset({"jam", "session", "jazz", "group"}))
    (2, 0.6666666666666666)
    """
    shared = len(a & b)
    return shared, shared / max(1, min(len(a), len(b)))


@dataclass
class Said:
    """A statement the rule compares: one said now (``new``) or a stored fact (``kind`` its stored kind). ``turn``
    orders them (stored facts come before every turn of a session; statements of one turn are never related);
    ``person`` None: never related. ``relate`` reads everything else from ``text``."""

    ref: str
    person: str | None
    turn: int
    text: str
    new: bool = True
    kind: str | None = None  # a stored fact's kind; a new statement's comes from its words
    current: bool = True  # False: a stored fact already superseded

    @functools.cached_property
    def topic(self) -> frozenset[str]:
        return frozenset(topic(self.text))

    @functools.cached_property
    def revision(self) -> bool:
        return self.new and self.person is not None and revises(self.text)

    @functools.cached_property
    def claim(self) -> bool:
        kind = fact_kind(self.text) if self.new else self.kind
        return kind in CLAIMS and len(sentences(self.text)) == 1

    @functools.cached_property
    def negated(self) -> bool:
        return negated(self.text)


def relate(said: Sequence[Said], vecs: np.ndarray | None = None, threshold: float = COSINE) -> list[Edge]:
    """The edges among ``said`` (see the module docstring), as ``(later, type, earlier)`` indices, in the order of
    the later statements. ``vecs`` (one unit row per statement, or None) makes the same-thing test a cosine.
    ``said`` is not modified (the same statements may be related again in another selection).

    >>> said = [Said("n1", "user", 1, "I organised a jam session and it was chaotic, loud and unproductive for the "
    ...                  "musicians"), Said("n2", "user", 3, "I used to hate chaotic jam sessions, but now I love "
    ...                  "that unproductive, loud mess with other musicians"), Said("n3", "Ana", 5, "I no longer "
    ...                  "like chaotic jam sessions: loud musicians, unproductive")]
    >>> relate(said)
    [(1, 'SUPERSEDES', 0)]
    >>> relate([Said("n1", "Ana", 0, "I believe the old bridge in town is safe for heavy trucks."),
    ...         Said("n2", "Ana", 1, "I don't believe the old bridge in town is safe for heavy trucks.")])
    [(1, 'CONFLICTS_WITH', 0)]
    """
    current = [s.current for s in said]
    out: list[Edge] = []
    for j, later in enumerate(said):
        if not later.new or later.person is None:
            continue
        rel = "SUPERSEDES" if later.revision else "CONFLICTS_WITH" if later.claim else None
        if rel is None:
            continue
        best, best_score = None, -1.0
        scores = None
        candidates: Sequence[int] = range(j)
        if vecs is not None:  # cosine first, in one product: long histories (PersonaMem) have few alike statements
            scores = vecs[:j] @ vecs[j] if j else np.zeros(0)
            candidates = np.flatnonzero(scores >= threshold).tolist()
        for i in candidates:
            earlier = said[i]
            if earlier.person != later.person or earlier.turn >= later.turn or not current[i]:
                continue
            if rel == "SUPERSEDES" and not earlier.new and earlier.kind not in UPDATABLE:
                continue
            if rel == "CONFLICTS_WITH" and (not earlier.claim or earlier.negated == later.negated):
                continue
            if scores is not None:
                score = float(scores[i])
            else:
                shared, share = shared_topic(earlier.topic, later.topic)
                if shared < MIN_SHARED or share < MIN_SHARE:
                    continue
                score = share
            if score > best_score:
                best, best_score = i, score
        if best is not None:
            out.append((j, rel, best))
            if rel == "SUPERSEDES":
                current[best] = False
    return out


def needs_vectors(said: Sequence[Said]) -> bool:
    """Whether ``relate`` could draw anything (a new revision or claim): when not, nothing need be embedded."""
    return any(s.new and s.person is not None and (s.revision or s.claim) for s in said)


def stance_kinds(edges: Sequence[Edge], said: Sequence[Said], kinds: Mapping[str, str]) -> dict[str, str]:
    """``kinds`` (ref → kind of each new statement) with the new ends of a SUPERSEDES whose kinds the store would
    refuse made ``preference`` (both ends state a stance; a stored fact keeps its kind).

    >>> said = [Said("n1", "u", 0, "I went to jazz clubs."), Said("n2", "u", 1, "I no longer go to jazz clubs.")]
    >>> stance_kinds([(1, "SUPERSEDES", 0)], said, {"n1": "experience", "n2": "experience"})
    {'n1': 'preference', 'n2': 'preference'}
    """
    out = dict(kinds)
    for j, rel, i in edges:
        later, earlier = said[j].ref, said[i].ref
        if rel != "SUPERSEDES" or compatible(rel, out[later], out.get(earlier, said[i].kind or "preference")):
            continue
        for ref in (later, earlier):
            if ref in out and out[ref] not in UPDATABLE:
                out[ref] = "preference"
    return out
