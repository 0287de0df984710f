"""Checks of an extractor's proposal before anything of its session is written.

Two stages, because they need different things:

- ``check_facts`` needs only the session: shape, kind, scope, turn, and the **verbatim quote**. A quote that does
  not occur in the session means the extractor invented something, so nothing it proposed for that session can be
  trusted: the session is rejected whole (``fatal``). Other faults reject that one fact.
- ``check_relations`` needs the stored graph: endpoints exist (a new fact of this proposal or a stored fact), both
  were said by the same person (where both are known), their kinds are compatible with the edge type, the edge is
  new, and SUPERSEDES stays acyclic. A relation joins two statements of one person about one thing: Ana's "I'm in
  Boston" never supersedes Ben's, whatever their words share (on LoCoMo a third of the rule extractor's edges joined
  two speakers).

Concept edits are checked by ``memory.concepts`` inside the write transaction, one edit at a time against the tree
as the earlier edits left it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

from memstate.memory.records import (
    FACT_RELATIONS,
    MAX_FACTS_PER_SESSION,
    MEMORY_KINDS,
    MEMORY_SCOPES,
    STORED_ID,
    FactProposal,
    Proposal,
    Rejection,
    RelationProposal,
    Turn,
)

MAX_FACT_CHARS = 1000
# Which kinds an edge may join. A preference or constraint is replaced by a later one; a fact or belief by a
# corrected one; an experience happened and is never outdated. Conflicts are between claims about the world, or
# between tastes and limits.
_COMPATIBLE = {
    "SUPERSEDES": ({"preference", "constraint"}, {"fact", "belief"}),
    "CONFLICTS_WITH": ({"preference", "constraint"}, {"fact", "belief", "experience", "constraint"}),
}


def squash(text: str) -> str:
    """Whitespace runs as one space (quotes are compared modulo whitespace only).

    >>> squash(" I  love\\n tea ")
    'I love tea'
    """
    return " ".join(text.split())


def quote_in(quote: str, text: str) -> bool:
    """``quote`` occurs verbatim in ``text`` (case and punctuation kept; whitespace runs compared as one space).

    >>> quote_in("love  tea", "I love tea."), quote_in("love coffee", "I love tea.")
    (True, False)
    """
    q = squash(quote)
    return bool(q) and q in squash(text)


def compatible(rel_type: str, src_kind: str, dst_kind: str) -> bool:
    """Whether ``src_kind REL dst_kind`` is an edge the store accepts.

    >>> compatible("SUPERSEDES", "preference", "preference"), compatible("SUPERSEDES", "experience", "experience")
    (True, False)
    """
    return any(src_kind in g and dst_kind in g for g in _COMPATIBLE.get(rel_type, ()))


@dataclass
class CheckedFacts:
    facts: list[FactProposal] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    fatal: str | None = None  # why the whole session is rejected

    @property
    def rejected_keys(self) -> set[str]:
        return {r.what.removeprefix("fact ") for r in self.rejected if r.what.startswith("fact ")}


def check_facts(proposal: Proposal, turns: Sequence[Turn]) -> CheckedFacts:
    """The facts of ``proposal`` that may be committed, the rejected ones, and a fatal reason if any."""
    out = CheckedFacts()
    if proposal.errors:
        out.fatal = "extractor gave no valid proposal: " + "; ".join(proposal.errors)
        return out
    # Quotes first, over every fact: one invented quote rejects the session whatever else is wrong.
    for f in proposal.facts:
        turn_ok = f.turn is None or (isinstance(f.turn, int) and 0 <= f.turn < len(turns))
        where = [turns[f.turn].content] if f.turn is not None and turn_ok else [t.content for t in turns]
        if not isinstance(f.quote, str) or not any(quote_in(f.quote, text) for text in where):
            place = f"turn {f.turn}" if f.turn is not None and turn_ok else "the session"
            out.fatal = f"fact {f.key}: quote not found verbatim in {place}: {str(f.quote)[:120]!r}"
            return out
    seen: set[str] = set()
    for i, f in enumerate(proposal.facts):
        reason = _fact_fault(f, len(turns), seen)
        if reason is None and i >= MAX_FACTS_PER_SESSION:
            reason = f"over the limit of {MAX_FACTS_PER_SESSION} facts per session"
        if reason:
            out.rejected.append(Rejection(f"fact {f.key}", reason))
        else:
            out.facts.append(f)
        seen.add(f.key)
    return out


def _fact_fault(f: FactProposal, n_turns: int, seen: set[str]) -> str | None:
    if not isinstance(f.key, str) or not f.key.strip() or STORED_ID.match(f.key):
        return f"key {f.key!r} must be a non-empty string that is not a stored id (m<N>)"
    if f.key in seen:
        return f"key {f.key!r} repeats an earlier fact of the proposal"
    if not isinstance(f.text, str) or not f.text.strip():
        return "text is empty"
    if len(f.text) > MAX_FACT_CHARS:
        return f"text has {len(f.text)} characters, at most {MAX_FACT_CHARS}"
    if f.kind not in MEMORY_KINDS:
        return f"kind {f.kind!r} is not one of {list(MEMORY_KINDS)}"
    if f.scope not in MEMORY_SCOPES:
        return f"scope {f.scope!r} is not one of {list(MEMORY_SCOPES)}"
    if f.turn is not None and (isinstance(f.turn, bool) or not isinstance(f.turn, int) or not 0 <= f.turn < n_turns):
        return f"turn {f.turn!r} is not a turn of the session (0..{n_turns - 1})"
    return None


def _different(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a != b


def check_relations(
    relations: Iterable[RelationProposal],
    kind_of: Callable[[str], str | None],
    supersedes: Callable[[str], Iterable[str]],
    stored: Callable[[str, str, str], bool],
    rejected_keys: Collection[str] = (),
    person_of: Callable[[str], str | None] | None = None,
) -> tuple[list[RelationProposal], list[Rejection]]:
    """The relations that may be committed and the rejected ones.

    ``kind_of(ref)`` is the kind of a new or stored fact (None: no such fact); ``supersedes(ref)`` the facts a
    stored fact SUPERSEDES; ``stored(src, type, dst)`` whether that edge is already stored; ``person_of(ref)`` who
    said the fact (its speaker, else its turn's role; None: unknown). Two facts of different persons are never
    related ("different speakers"); an unknown person is not held against an edge, since facts stored before
    speakers were kept have none.

    >>> kinds = {"m1": "preference", "m2": "preference", "n1": "preference"}
    >>> ok, bad = check_relations(
    ...     [RelationProposal("n1", "SUPERSEDES", "m2"), RelationProposal("m1", "SUPERSEDES", "n1")],
    ...     kinds.get, {"m2": ["m1"]}.get, lambda *e: False)
    >>> [(r.src, r.dst) for r in ok], [r.reason for r in bad]
    ([('n1', 'm2')], ['would close a SUPERSEDES cycle'])
    >>> ok, bad = check_relations([RelationProposal("n1", "SUPERSEDES", "m2")], kinds.get, {}.get,
    ...     lambda *e: False, person_of={"n1": "Ana", "m2": "Ben"}.get)
    >>> ok, [r.reason for r in bad]
    ([], ['different speakers'])
    """
    accepted: list[RelationProposal] = []
    rejected: list[Rejection] = []
    added: dict[str, list[str]] = defaultdict(list)
    seen: set[tuple[str, str, str]] = set()

    def reaches(start: str, goal: str) -> bool:  # along SUPERSEDES edges, stored and accepted
        todo, visited = [start], {start}
        while todo:
            node = todo.pop()
            if node == goal:
                return True
            for nxt in (*(supersedes(node) or ()), *added.get(node, ())):
                if nxt not in visited:
                    visited.add(nxt)
                    todo.append(nxt)
        return False

    for r in relations:
        reason = None
        ends = (r.src, r.dst)
        if r.type not in FACT_RELATIONS:
            reason = f"type {r.type!r} is not one of {list(FACT_RELATIONS)}"
        elif r.src == r.dst:
            reason = "a fact cannot relate to itself"
        else:
            for end in ends:
                if kind_of(end) is None:
                    reason = f"endpoint {end} was rejected" if end in rejected_keys else f"no fact {end}"
                    break
        if reason is None and person_of is not None and _different(person_of(r.src), person_of(r.dst)):
            reason = "different speakers"
        if reason is None and not compatible(r.type, kind_of(r.src), kind_of(r.dst)):
            reason = f"a {kind_of(r.src)} cannot {r.type} a {kind_of(r.dst)}"
        if reason is None and ((r.src, r.type, r.dst) in seen or stored(r.src, r.type, r.dst)):
            reason = "already stored"
        if reason is None and r.type == "SUPERSEDES" and reaches(r.dst, r.src):
            reason = "would close a SUPERSEDES cycle"
        if reason:
            rejected.append(Rejection(f"relation {r.src} {r.type} {r.dst}", reason))
            continue
        accepted.append(r)
        seen.add((r.src, r.type, r.dst))
        if r.type == "SUPERSEDES":
            added[r.src].append(r.dst)
    return accepted, rejected
