"""An extractor that keeps every turn: nothing said is lost.

The rule extractor keeps only first-person cue sentences of user turns, so most of what a conversation says (the
other speaker, an assistant's search excerpts, plain statements without a cue) never reaches the store; on LoCoMo a
third of the evidence turns had no fact. ``TurnExtractor`` makes each turn of every speaker (system turns aside)
one fact: ``"<speaker> (<time>): <content>"``, so the speaker's name and the session date are searchable words, with
the content as the verbatim quote. A turn longer than a fact may be is cut at sentence ends (at spaces inside a
sentence longer still) into consecutive facts, each quoting its own slice. The kind and scope come from the rule
extractor's cues where a piece has one (``fact`` and ``global`` otherwise). No concepts.

One interpretation only, where the words say it: a piece in which a person says their view changed ("I used to love
festivals, but these days …") SUPERSEDES the earlier statement of the same person about the same thing (a piece of
this session or a stored fact in ``context``); ``memory.revision`` has the test and why it is that strict. Both ends
of such an edge state a stance, so a new piece whose cue kind the store would refuse on a SUPERSEDES (an
``experience`` narrating where the old view came from, say) is stored as a ``preference``; a stored fact keeps its
kind and is superseded only when it already is a preference or constraint. ``embedder`` (optional) makes the
same-thing test a cosine ≥ ``threshold`` instead of shared topic words. No CONFLICTS_WITH: nothing measured says when
two turns contradict precisely enough.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from memstate.memory.embed import Embedder
from memstate.memory.records import FactProposal, Proposal, RelationProposal, StoredFact, Turn
from memstate.memory.revision import Said, revises, supersessions
from memstate.memory.rule_extractor import fact_kind, scope_of
from memstate.memory.validate import MAX_FACT_CHARS, compatible

_SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)|[.!?]+(?=[A-Z])|\n")
_MIN_PIECE = 100  # a piece's room when a very long speaker/time label leaves less
_UPDATABLE = frozenset({"preference", "constraint"})
_LABEL = re.compile(r"(?P<who>.+?)(?: \(.*\))?: ")


def pieces(text: str, limit: int) -> list[str]:
    """``text`` as consecutive verbatim slices of at most ``limit`` characters, cut after sentence ends where
    possible (slices of the text itself, so each is a verbatim quote whatever the spacing between sentences).

    >>> pieces("One two.Three four five.", 12)
    ['One two.', 'Three four', 'five.']
    """
    text = text.strip()
    if len(text) <= limit:
        return [text] if text else []
    ends = [m.end() for m in _SENTENCE_END.finditer(text)] + [len(text)]
    out: list[str] = []
    start = 0
    while start < len(text):
        fitting = [e for e in ends if start < e <= start + limit]
        if fitting:
            end = fitting[-1]
        else:  # one sentence over the limit: cut at the last space that fits
            space = text.rfind(" ", start + 1, start + limit + 1)
            end = space if space > start else start + limit
        piece = text[start:end].strip()
        if piece:
            out.append(piece)
        start = end
        while start < len(text) and text[start].isspace():
            start += 1
    return out


def label(turn: Turn) -> str:
    """The prefix that names who spoke and when.

    >>> label(Turn("user", "Hi", "8 May, 2023", "Caroline")), label(Turn("assistant", "Hi"))
    ('Caroline (8 May, 2023): ', 'assistant: ')
    """
    who = turn.speaker or turn.role
    return f"{who} ({turn.time}): " if turn.time else f"{who}: "


def person(turn: Turn) -> str | None:
    """Whose view a turn states: its speaker, else its role; None for an assistant or system turn, whose words
    are never related (an assistant holds no preferences of its own).

    >>> person(Turn("user", "Hi", speaker="Ana")), person(Turn("user", "Hi")), person(Turn("assistant", "Hi"))
    ('Ana', 'user', None)
    """
    return (turn.speaker or turn.role) if turn.role == "user" else None


def stored_person(fact: StoredFact) -> str | None:
    """Whose view a stored fact states: its speaker, else the name this extractor's ``label`` put before the quote
    (the store keeps speakers but not roles); None when neither says, or when it was an assistant's.

    >>> f = StoredFact("m1", "user (turn 3): I love tea", "preference", "global", "I love tea", "s", 3, "turn 3")
    >>> stored_person(f), stored_person(replace(f, text="I love tea")), stored_person(replace(f, speaker="Ana"))
    ('user', None, 'Ana')
    """
    if fact.speaker:
        return fact.speaker
    if not fact.quote or not fact.text.endswith(fact.quote):
        return None
    m = _LABEL.fullmatch(fact.text[: len(fact.text) - len(fact.quote)])
    return m["who"] if m and m["who"] not in ("assistant", "system") else None


class TurnExtractor:
    """See the module docstring."""

    def __init__(self, embedder: Embedder | None = None, *, threshold: float = 0.55) -> None:
        self.embedder = embedder
        self.threshold = threshold

    def propose(self, turns: Sequence[Turn], context: Sequence[StoredFact]) -> Proposal:
        facts: list[FactProposal] = []
        said = [
            Said(f.id, stored_person(f), -1, f.quote, new=False, updatable=f.kind in _UPDATABLE, current=f.current)
            for f in context
        ]
        for i, turn in enumerate(turns):
            if turn.role == "system":
                continue  # instructions to a model, not something a person said
            prefix = label(turn)
            for piece in pieces(turn.content, max(MAX_FACT_CHARS - len(prefix), _MIN_PIECE)):
                key = f"n{len(facts) + 1}"
                kind = fact_kind(piece) or "fact"
                facts.append(FactProposal(key, prefix + piece, kind, scope_of(piece), piece, i))
                said.append(Said(key, person(turn), i, piece, new=True))
        pairs = self._supersessions(said)
        kinds = {f.key: f.kind for f in facts}
        relations = []
        for j, i in pairs:
            later, earlier = said[j].ref, said[i].ref
            if not compatible("SUPERSEDES", kinds[later], kinds.get(earlier, "preference")):
                for ref in (later, earlier):  # both state a stance (see the module docstring)
                    if ref in kinds and kinds[ref] not in _UPDATABLE:
                        kinds[ref] = "preference"
            relations.append(RelationProposal(later, "SUPERSEDES", earlier))
        facts = [replace(f, kind=kinds[f.key]) for f in facts]
        return Proposal(tuple(facts), relations=tuple(relations))

    def _supersessions(self, said: list[Said]) -> list[tuple[int, int]]:
        if not any(s.new and s.person is not None and revises(s.text) for s in said):
            return []  # the common case: nothing to compare, nothing to embed
        vecs = self.embedder.encode([s.text for s in said]) if self.embedder is not None else None
        return supersessions(said, vecs, self.threshold)
