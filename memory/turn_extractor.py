"""An extractor that keeps every turn: nothing said is lost.

The rule extractor keeps only first-person cue sentences of user turns, so most of what a conversation says (the
other speaker, an assistant's search excerpts, plain statements without a cue) never reaches the store; on LoCoMo a
third of the evidence turns had no fact. ``TurnExtractor`` makes each turn of every speaker (system turns aside)
one fact: ``"<speaker> (<date>): <content>"``, so the speaker's name and the session date are searchable words, with
the content as the verbatim quote. A turn longer than a fact may be is cut at sentence ends (at spaces inside a
sentence longer still) into consecutive facts, each quoting its own slice. The kind and scope come from the rule
extractor's cues where a piece has one (``fact`` and ``global`` otherwise). No concepts.

Relations come from the one relation rule (``memory.relation_rule``, which has the test and why it is that strict):
a piece in which a person says their view changed ("I used to love festivals, but these days …") SUPERSEDES the
earlier statement of the same person about the same thing (a piece of this session or a stored fact in
``context``), and a one-sentence claim CONFLICTS_WITH an earlier one it negates. A new piece whose cue kind the
store would refuse on a SUPERSEDES is stored as a ``preference`` (``relation_rule.stance_kinds``). ``embedder``
(optional) makes the same-thing test a cosine ≥ ``threshold`` instead of shared topic words.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from memstate.embedding import Embedder
from memstate.memory.records import FactProposal, Proposal, RelationProposal, StoredFact, Turn
from memstate.memory.relation_rule import (
    COSINE,
    RELATION_RULE_VERSION,
    Edge,
    Said,
    needs_vectors,
    relate,
    stance_kinds,
    stored_person,
)
from memstate.memory.rule_extractor import fact_kind, scope_of
from memstate.memory.validate import MAX_FACT_CHARS
from memstate.prompts import date_of

_SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)|[.!?]+(?=[A-Z])|\n")
_MIN_PIECE = 100  # a piece's room when a very long speaker/time label leaves less


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
    """The prefix that names who spoke and on which day (the full time stays in the fact's ``time``).

    >>> label(Turn("user", "Hi", "1:56 pm on 8 May, 2023", "Caroline")), label(Turn("assistant", "Hi"))
    ('Caroline (8 May, 2023): ', 'assistant: ')
    """
    who = turn.speaker or turn.role
    return f"{who} ({date_of(turn.time)}): " if turn.time else f"{who}: "


def embedding_text(text: str, time: str | None) -> str:
    """What a fact's vector is computed from: its text without the date of its label. The date is matched lexically
    and kept in the fact's ``time``; in a small embedder's vector it only dilutes what was said.

    >>> embedding_text("Caroline (8 May, 2023): I ran.", "1:56 pm on 8 May, 2023")
    'Caroline: I ran.'
    >>> embedding_text("I ran (8 May, 2023): far.", None)
    'I ran (8 May, 2023): far.'
    """
    return text.replace(f" ({date_of(time)}): ", ": ", 1) if time else text


def person(turn: Turn) -> str | None:
    """Whose view a turn states: its speaker, else its role; None for an assistant or system turn, whose words
    are never related (an assistant holds no preferences of its own).

    >>> person(Turn("user", "Hi", speaker="Ana")), person(Turn("user", "Hi")), person(Turn("assistant", "Hi"))
    ('Ana', 'user', None)
    """
    return (turn.speaker or turn.role) if turn.role == "user" else None


class TurnExtractor:
    """See the module docstring."""

    relation_rule = RELATION_RULE_VERSION  # recorded by the store

    def __init__(self, embedder: Embedder | None = None, *, threshold: float = COSINE) -> None:
        self.embedder = embedder
        self.threshold = threshold

    def propose(self, turns: Sequence[Turn], context: Sequence[StoredFact]) -> Proposal:
        facts: list[FactProposal] = []
        said = [Said(f.id, stored_person(f), -1, f.quote, new=False, kind=f.kind, current=f.current) for f in context]
        for i, turn in enumerate(turns):
            if turn.role == "system":
                continue  # instructions to a model, not something a person said
            prefix = label(turn)
            for piece in pieces(turn.content, max(MAX_FACT_CHARS - len(prefix), _MIN_PIECE)):
                key = f"n{len(facts) + 1}"
                kind = fact_kind(piece) or "fact"
                facts.append(FactProposal(key, prefix + piece, kind, scope_of(piece), piece, i))
                said.append(Said(key, person(turn), i, piece))
        edges = self._relate(said)
        kinds = stance_kinds(edges, said, {f.key: f.kind for f in facts})
        relations = tuple(RelationProposal(said[j].ref, rel, said[i].ref) for j, rel, i in edges)
        facts = [replace(f, kind=kinds[f.key]) for f in facts]
        return Proposal(tuple(facts), relations=relations)

    def _relate(self, said: list[Said]) -> list[Edge]:
        if not needs_vectors(said):
            return []  # the common case: nothing to compare, nothing to embed
        vecs = self.embedder.encode([s.text for s in said]) if self.embedder is not None else None
        return relate(said, vecs, self.threshold)
