"""When a later statement revises an earlier one: the SUPERSEDES edges ``TurnExtractor`` draws.

An edge the policy is trained to trust has to be right far more often than not, so the test is conservative:

- **A revision cue** (``rule_extractor.revises``). The later statement says that something changed: a strong cue
  ("no longer", "anymore", "used to", "changed my mind", "change of heart", "rethinking", "these days", "from now
  on", "I'd rather", "I'm done with", "I've stopped/switched/given up", …) counts 2, a weak one ("now", "actually",
  "lately", "prefer", "I want to", "completely", "I've been thinking") 1, questions left out; a statement in the
  first person scoring 2 or more is a revision. On the first half of MemSyco's ``valid_memory_selection`` a user
  turn with "changed my mind", "rethinking", "anymore" or "I'd rather" is the one stating the current preference
  every time, with "used to" 94% of the time, but with "actually" 84%, "lately" 83%, "now" 65% (they narrate too;
  on LoCoMo "Been super busy lately"), and with "realized", "decided" or "instead" under a third: those are no cues.
- **The same person.** Both statements are the same person's (``speaker``, else the turn's role); an assistant's
  turns are never related (an assistant states no preferences of its own).
- **The same thing.** With an embedder: the two statements' cosine is at least ``threshold``. Without: they share at
  least 4 topic words (``rule_extractor.topic``) making at least a fifth of the smaller statement's topic words
  (whole turns share a few words by chance; a single shared word such as "Boston" is chance).
- **The nearest one.** The revision supersedes the one earlier statement that is most alike (cosine, else shared
  share), among those said before its turn and still current: chained changes read C → B → A.

Designed on the first 175 rows of ``valid_memory_selection`` (file order), measured by ``memstate.evaluate.relations``
(correct: the current memory's turn SUPERSEDES the outdated one's; the memory items never reach the extractor);
SUPERSEDES drawn / correct, precision, recall (rows with a correct edge):

- shared words (the default): rows 1-175 106 / 97, P 0.92, R 0.55; rows 176-350 101 / 93, P 0.92, R 0.53; all 350
  207 / 190, P 0.92, R 0.54.
- MiniLM cosine ≥ 0.55: rows 1-175 133 / 123, P 0.92, R 0.70; rows 176-350 139 / 119, P 0.86, R 0.68; all 350
  272 / 242, P 0.89, R 0.69.

On LoCoMo's first five conversations (2760 turn facts) the default draws 3 edges, all within one speaker, none a
real change of view: rare, not yet right there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from memstate.memory.rule_extractor import revises, topic

MIN_SHARED = 4
MIN_SHARE = 0.2


def shared_topic(a: frozenset[str], b: frozenset[str]) -> tuple[int, float]:
    """How many topic words two statements share, and what share of the smaller one's words that is.

    >>> shared_topic(frozenset({"jam", "session", "chaotic"}), frozenset({"jam", "session", "jazz", "group"}))
    (2, 0.6666666666666666)
    """
    shared = len(a & b)
    return shared, shared / max(1, min(len(a), len(b)))


@dataclass
class Said:
    """A statement the revision test compares: a piece of this session (``new``) or a stored fact. ``turn`` orders
    them (stored facts come before every turn of the session); ``person`` None: never related."""

    ref: str
    person: str | None
    turn: int
    text: str
    new: bool = True
    updatable: bool = True  # a stored fact must already be a preference or constraint to be superseded
    current: bool = True
    topic: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self.topic = frozenset(topic(self.text))


def supersessions(
    said: Sequence[Said], vecs: np.ndarray | None = None, threshold: float = 0.55
) -> list[tuple[int, int]]:
    """``(later, earlier)`` index pairs of ``said``: each new revision and the earlier statement it supersedes.

    ``vecs`` (one unit row per statement, or None) switches the same-thing test from shared topic words to cosine.

    >>> said = [Said("n1", "user", 1, "I organised a jam session and it was chaotic, loud and unproductive for the "
    ...                  "musicians"), Said("n2", "user", 3, "I used to hate chaotic jam sessions, but now I love "
    ...                  "that unproductive, loud mess with other musicians"), Said("n3", "Ana", 5, "I no longer "
    ...                  "like chaotic jam sessions: loud musicians, unproductive")]
    >>> supersessions(said)
    [(1, 0)]
    """
    out: list[tuple[int, int]] = []
    for j, later in enumerate(said):
        if not later.new or later.person is None or not revises(later.text):
            continue
        best, best_score = None, -1.0
        for i, earlier in enumerate(said):
            if earlier.person != later.person or earlier.turn >= later.turn or not earlier.current:
                continue
            if not earlier.new and not earlier.updatable:
                continue
            if vecs is not None:
                score = float(vecs[i] @ vecs[j])
                if score < threshold:
                    continue
            else:
                shared, share = shared_topic(earlier.topic, later.topic)
                if shared < MIN_SHARED or share < MIN_SHARE:
                    continue
                score = share
            if score > best_score:
                best, best_score = i, score
        if best is not None:
            out.append((j, best))
            said[best].current = False
    return out
