"""The plain data the memory pipeline passes around: turns and sessions, an extractor's proposal, stored facts and
their ids, ingest reports.

Kept apart from the store and the extractors so that both import it without importing each other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from memstate.schema import SCOPES

MEMORY_KINDS = ("preference", "fact", "belief", "experience", "constraint")
MEMORY_SCOPES = SCOPES  # global · domain · task · situation
FACT_RELATIONS = ("SUPERSEDES", "CONFLICTS_WITH")
CONCEPT_OPS = ("CREATE", "MERGE", "SPLIT")
TURN_ROLES = ("user", "assistant", "system")
MAX_FACTS_PER_SESSION = 32
STORED_ID = re.compile(r"^m[0-9]+$")  # a stored fact's id: "m" and its number in the store


def fact_id(num: int) -> str:
    return f"m{num}"


def fact_num(ref: str) -> int | None:
    """The number of a stored fact id ("m12" → 12); None for anything else.

    >>> fact_num("m12"), fact_num("n1")
    (12, None)
    """
    return int(ref[1:]) if isinstance(ref, str) and STORED_ID.match(ref) else None


@dataclass(frozen=True)
class Turn:
    """One dialogue turn as ingested; ``time`` is whatever timestamp text the source gives (ISO date, "turn 7").

    ``speaker`` names who spoke where the source says (LoCoMo's two people, both ``user``: the memory is about
    both); ``source`` is the turn's id in its source (LoCoMo's ``dia_id`` "D1:3", MemSyco's ``<row>:<index>``),
    kept on every fact drawn from the turn as provenance. ``source`` is not part of equality: the same words from
    another copy of a file are the same turn."""

    role: str
    content: str
    time: str | None = None
    speaker: str | None = None
    source: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Session:
    """A batch of turns committed (or rejected) as one unit. ``id`` None lets the store derive one from the
    content, so re-ingesting the same dialogue is a no-op. ``where`` names the source (``file:line``) for messages."""

    turns: tuple[Turn, ...]
    id: str | None = None
    time: str | None = None
    where: str = ""


@dataclass(frozen=True)
class FactProposal:
    """A new atomic fact. ``key`` is how relations and SPLITs of the same proposal refer to it ("n1", "n2", …);
    ``quote`` must occur verbatim in turn ``turn`` of the session (in any turn when ``turn`` is None)."""

    key: str
    text: str
    kind: str
    scope: str
    quote: str
    turn: int | None = None
    concepts: tuple[str, ...] = ()


@dataclass(frozen=True)
class ConceptEdit:
    """An edit of the concept tree.

    - ``CREATE name [parent]``: a new concept (a no-op when a live concept already has that name, since an
      extractor sees only a slice of the store);
    - ``MERGE name into``: ``name``'s facts and child concepts move to ``into``; ``name`` is retired;
    - ``SPLIT name parts``: each part ``(child, facts)`` becomes a new child of ``name`` and takes those facts
      (stored ids or proposal keys) from it.
    """

    op: str
    name: str
    parent: str | None = None
    into: str | None = None
    parts: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class RelationProposal:
    """``src TYPE dst``; each end is a proposal key ("n2") or a stored fact id ("m17")."""

    src: str
    type: str
    dst: str


@dataclass(frozen=True)
class Proposal:
    """What an extractor proposes for one session. ``errors`` non-empty means the extractor could not produce a
    usable proposal (e.g. an LLM kept answering invalid JSON): the session is rejected whole."""

    facts: tuple[FactProposal, ...] = ()
    concepts: tuple[ConceptEdit, ...] = ()
    relations: tuple[RelationProposal, ...] = ()
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class StoredFact:
    """A committed fact with its derived state. ``turn`` is the turn's index in the store's whole history
    (sessions in ingest order); ``superseded_by`` / ``supersedes`` / ``conflicts_with`` list stored fact ids."""

    id: str
    text: str
    kind: str
    scope: str
    quote: str
    session: str
    turn: int | None
    time: str | None
    concepts: tuple[str, ...] = ()
    supersedes: tuple[str, ...] = ()
    superseded_by: tuple[str, ...] = ()
    conflicts_with: tuple[str, ...] = ()
    speaker: str | None = None  # who said the source turn, where known
    source: str | None = None  # the source turn's id in its input (LoCoMo dia_id), where known

    @property
    def current(self) -> bool:
        """No stored fact supersedes this one."""
        return not self.superseded_by


@dataclass(frozen=True)
class Concept:
    """A live concept of the tree: its parent's name and the ids of the facts it contains."""

    name: str
    parent: str | None
    facts: tuple[str, ...]


@dataclass(frozen=True)
class Rejection:
    """A proposal part that was not committed: what it was and why."""

    what: str
    reason: str


@dataclass(frozen=True)
class IngestReport:
    """The outcome of one session: ``committed``, ``rejected`` (nothing written) or ``duplicate`` (already in the
    store, nothing written). ``fact_ids`` and ``edges`` are what was committed; ``facts`` / ``relations`` count them.
    ``parts``: the ids the session was committed as when it held more facts than one session may (see
    ``memory.commit``); empty when it was committed whole."""

    session_id: str
    status: str
    fact_ids: tuple[str, ...] = ()
    edges: tuple[tuple[str, str, str], ...] = ()
    concept_edits: int = 0
    rejected: tuple[Rejection, ...] = ()
    parts: tuple[str, ...] = ()

    @property
    def facts(self) -> int:
        return len(self.fact_ids)

    @property
    def relations(self) -> int:
        return len(self.edges)
