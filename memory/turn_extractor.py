"""An extractor that keeps every turn: nothing said is lost.

The rule extractor keeps only first-person cue sentences of user turns, so most of what a conversation says (the
other speaker, an assistant's search excerpts, plain statements without a cue) never reaches the store; on LoCoMo a
third of the evidence turns had no fact. ``TurnExtractor`` makes each turn of every speaker (system turns aside)
one fact: ``"<speaker> (<time>): <content>"``, so the speaker's name and the session date are searchable words, with
the content as the verbatim quote. A turn longer than a fact may be is cut at sentence ends (at spaces inside a
sentence longer still) into consecutive facts, each quoting its own slice. The kind and scope come from the rule
extractor's cues where a piece has one (``fact`` and ``global`` otherwise). No relations and no concepts: this
extractor records what was said, it does not interpret it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from memstate.memory.records import FactProposal, Proposal, StoredFact, Turn
from memstate.memory.rule_extractor import fact_kind, scope_of
from memstate.memory.validate import MAX_FACT_CHARS

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
    """The prefix that names who spoke and when.

    >>> label(Turn("user", "Hi", "8 May, 2023", "Caroline")), label(Turn("assistant", "Hi"))
    ('Caroline (8 May, 2023): ', 'assistant: ')
    """
    who = turn.speaker or turn.role
    return f"{who} ({turn.time}): " if turn.time else f"{who}: "


class TurnExtractor:
    """See the module docstring."""

    def propose(self, turns: Sequence[Turn], context: Sequence[StoredFact]) -> Proposal:
        facts: list[FactProposal] = []
        for i, turn in enumerate(turns):
            if turn.role == "system":
                continue  # instructions to a model, not something a person said
            prefix = label(turn)
            for piece in pieces(turn.content, max(MAX_FACT_CHARS - len(prefix), _MIN_PIECE)):
                key = f"n{len(facts) + 1}"
                kind = fact_kind(piece) or "fact"
                facts.append(FactProposal(key, prefix + piece, kind, scope_of(piece), piece, i))
        return Proposal(tuple(facts))
