"""The ingest commit: a session's turns, through the extractor's checked proposal, into the store in one
transaction. Mixed into ``MemoryStore`` (``memory.store``), which keeps the connection, the index and the schema.
(Reading sessions from the released formats is ``memory.ingest``.)

A session whose proposal holds more facts than ``MAX_FACTS_PER_SESSION`` is not cut: it is ingested as two
halves (ids ``<id>.p1`` / ``<id>.p2``, split again while still too big), so a long session loses nothing to the
cap; only a single turn with more facts than the cap keeps the first ones and reports the rest as rejected.

A session is committed in ONE transaction — its row, its facts, their vectors, its relations and concept edits —
after the extractor's proposal was checked (``memstate.memory.validate``). The file is in WAL mode with
``synchronous=NORMAL``: a process killed at any point leaves every committed session intact and no trace of the
one in flight (an OS crash or power loss may lose the last commits, never consistency).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time as _time
from collections.abc import Iterable, Sequence

import numpy as np

from memstate.embedding import Embedder
from memstate.memory.concepts import ConceptTree
from memstate.memory.embed import normalize
from memstate.memory.extract import Extractor
from memstate.memory.records import (
    MAX_FACTS_PER_SESSION,
    TURN_ROLES,
    FactProposal,
    IngestReport,
    Proposal,
    Rejection,
    Session,
    StoredFact,
    Turn,
    fact_id,
    fact_num,
)
from memstate.memory.turn_extractor import embedding_text
from memstate.memory.validate import check_facts, check_relations

logger = logging.getLogger("memstate.memory")


def session_digest(turns: Sequence[Turn]) -> str:
    """A content id for a session given without one, so ingesting the same dialogue twice is a no-op."""
    # the speaker only when given, so that sessions without one keep the ids they had before speakers existed
    blob = json.dumps([[t.role, t.content, t.time, *([t.speaker] if t.speaker else [])] for t in turns],
                      ensure_ascii=False)  # fmt: skip
    return "s-" + hashlib.sha256(blob.encode()).hexdigest()[:16]


def as_turn(turn: Turn | dict, where: str = "turn") -> Turn:
    """A ``Turn`` from a Turn or a ``{role, content, time?}`` dict; raises ValueError naming the field."""
    if isinstance(turn, dict):
        turn = Turn(turn.get("role"), turn.get("content"), turn.get("time"), turn.get("speaker"), turn.get("source"))  # type: ignore[arg-type]
    if turn.role not in TURN_ROLES:
        raise ValueError(f"{where}: role {turn.role!r} is not one of {list(TURN_ROLES)}")
    if not isinstance(turn.content, str):
        raise ValueError(f"{where}: content must be a string, got {type(turn.content).__name__}")
    if turn.time is not None and not isinstance(turn.time, str):
        raise ValueError(f"{where}: time must be a string or null, got {type(turn.time).__name__}")
    for name in ("speaker", "source"):
        if getattr(turn, name) is not None and not isinstance(getattr(turn, name), str):
            raise ValueError(f"{where}: {name} must be a string or null, got {type(getattr(turn, name)).__name__}")
    return turn


# Weight of the fact before it in a fact's vector. LoCoMo's five shipped conversations (recall at 565 tokens):
# 0.3 and 1.0 measure within 0.01 of 0.5, and all three 0.015-0.025 above no context.
CONTEXT_WEIGHT = 0.5


def fact_vectors(embedder: Embedder, facts: Sequence[FactProposal], turns: Sequence[Turn]) -> np.ndarray:
    """One vector per fact for dense search: its ``embedding_text`` plus ``CONTEXT_WEIGHT`` times the vector of the
    fact before it in the session, renormalized. A reply says little by itself ("Yes, every Sunday since May!"):
    it is found by what it answers."""
    texts = [embedding_text(f.text, turns[f.turn].time if f.turn is not None else None) for f in facts]
    own = normalize(embedder.encode(texts))
    before = np.vstack([np.zeros_like(own[:1]), own[:-1]])
    return normalize(own + CONTEXT_WEIGHT * before)


class CommitMixin:
    """``MemoryStore``'s ingest methods; they write through its ``_db`` and ``_transaction`` and read its ``_index``,
    ``embedder`` and ``facts``."""

    def ingest(self, sessions: Iterable[Session], extractor: Extractor) -> list[IngestReport]:
        """``ingest_session`` for each session in order."""
        return [
            self.ingest_session(list(s.turns), extractor, session_id=s.id, time=s.time, where=s.where) for s in sessions
        ]

    def ingest_session(
        self,
        turns: Sequence[Turn | dict],
        extractor: Extractor,
        *,
        session_id: str | None = None,
        time: str | None = None,
        where: str = "",
    ) -> IngestReport:
        """Extract, check and commit one session in one transaction; see the module docstring.

        A session already in the store (same id; without an id, same content) is skipped as ``duplicate``. A
        proposal with a quote not in the session, or an extractor that gave no valid proposal, rejects the whole
        session: nothing is written and the report says why. Other invalid parts (a fact with an unknown kind, an
        edge to a missing fact, a SUPERSEDES cycle, a concept edit that would break the tree) are dropped with
        their reasons and the rest is committed."""
        label = where or session_id or "session"
        turns = [as_turn(t, f"{label} turn {i}") for i, t in enumerate(turns)]
        sid = session_id or session_digest(turns)
        if self._has_session(sid):
            return IngestReport(sid, "duplicate")
        proposal: Proposal = extractor.propose(turns, self.context(turns))
        if len(proposal.facts) > MAX_FACTS_PER_SESSION and len(turns) > 1 and not proposal.errors:
            return self._ingest_halves(turns, extractor, sid, time, where)
        checked = check_facts(proposal, turns)
        if checked.fatal:
            logger.warning("session %s rejected: %s", sid, checked.fatal)
            return IngestReport(sid, "rejected", rejected=(Rejection("session", checked.fatal), *checked.rejected))
        vecs = fact_vectors(self.embedder, checked.facts, turns) if checked.facts else None
        rejected = list(checked.rejected)
        with self._transaction():
            self._sync()
            if self._has_session(sid):
                return IngestReport(sid, "duplicate")
            (first_turn,) = self._db.execute("SELECT COALESCE(MAX(first_turn + n_turns), 0) FROM sessions").fetchone()
            cur = self._db.execute(
                "INSERT INTO sessions (id, time, n_turns, first_turn, extractor, ingested_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (sid, time, len(turns), first_turn, type(extractor).__name__, _now()),
            )
            session = int(cur.lastrowid)
            self._record_relation_rule(extractor)
            new: dict[str, int] = {}
            for f, vec in zip(checked.facts, vecs if vecs is not None else [], strict=True):
                src = turns[f.turn] if f.turn is not None else None
                turn = first_turn + f.turn if f.turn is not None else None
                cur = self._db.execute(
                    "INSERT INTO facts (text, kind, scope, session, turn, quote, time, speaker, source) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (f.text.strip(), f.kind, f.scope, session, turn, f.quote, (src and src.time) or time,
                     src and src.speaker, src and src.source),
                )  # fmt: skip
                new[f.key] = int(cur.lastrowid)
                self._db.execute(
                    "INSERT INTO fact_vectors (fact, vec) VALUES (?, ?)",
                    (new[f.key], np.ascontiguousarray(vec, dtype=np.float32).tobytes()),
                )
            kinds = {f.key: f.kind for f in checked.facts}
            relations = self._commit_relations(proposal, new, kinds, checked.rejected_keys, session, rejected)
            edits = self._commit_concepts(proposal, checked.facts, new, session, rejected)
        self._sync()
        for r in rejected:
            logger.info("session %s: rejected %s: %s", sid, r.what, r.reason)
        return IngestReport(
            sid,
            "committed",
            fact_ids=tuple(fact_id(n) for n in new.values()),
            edges=tuple(relations),
            concept_edits=edits,
            rejected=tuple(rejected),
        )

    def _ingest_halves(
        self, turns: list[Turn], extractor: Extractor, sid: str, time: str | None, where: str
    ) -> IngestReport:
        """A session with more facts than one may commit, ingested as two halves (see the module docstring); the
        report adds theirs up and lists the part ids it was committed as."""
        mid = len(turns) // 2
        parts = [
            self.ingest_session(half, extractor, session_id=f"{sid}.p{n}", time=time, where=where)
            for n, half in ((1, turns[:mid]), (2, turns[mid:]))
        ]
        statuses = {p.status for p in parts}
        status = statuses.pop() if len(statuses) == 1 else "committed"
        logger.info("session %s: more than %d facts, ingested in parts", sid, MAX_FACTS_PER_SESSION)
        return IngestReport(
            sid,
            status,
            fact_ids=tuple(f for p in parts for f in p.fact_ids),
            edges=tuple(e for p in parts for e in p.edges),
            concept_edits=sum(p.concept_edits for p in parts),
            rejected=tuple(r for p in parts for r in p.rejected),
            parts=tuple(i for p in parts for i in (p.parts or (p.session_id,))),
        )

    def _commit_relations(
        self,
        proposal: Proposal,
        new: dict[str, int],
        kinds: dict[str, str],
        rejected_keys: set[str],
        session: int,
        rejected: list[Rejection],
    ) -> list[tuple[str, str, str]]:
        idx = self._index

        def num(ref: str) -> int | None:
            return new[ref] if ref in new else fact_num(ref)

        def kind_of(ref: str) -> str | None:
            if ref in kinds:
                return kinds[ref]
            n = fact_num(ref)
            return None if n is None else idx.kind(n)

        def supersedes(ref: str) -> list[str]:
            n = fact_num(ref)
            return [fact_id(d) for rel, d in idx.out.get(n, ()) if rel == "SUPERSEDES"] if n is not None else []

        def stored(src: str, rel: str, dst: str) -> bool:
            return (num(src), rel, num(dst)) in idx.edges

        # Who said each endpoint: the speaker column, already written for this session's facts. Facts of turns
        # without a speaker (MemSyco's user/assistant roles; roles are not stored) give None, which the check
        # does not hold against an edge: there the extractor keeps to one person (TurnExtractor relates user turns).
        ends = {n for r in proposal.relations for n in (num(r.src), num(r.dst)) if n is not None}
        speakers = dict(
            self._db.execute(f"SELECT num, speaker FROM facts WHERE num IN ({', '.join('?' * len(ends))})", list(ends))
        ) if ends else {}  # fmt: skip

        def person_of(ref: str) -> str | None:
            return speakers.get(num(ref))

        ok, bad = check_relations(proposal.relations, kind_of, supersedes, stored, rejected_keys, person_of)
        rejected += bad
        out = []
        for r in ok:
            src, dst = num(r.src), num(r.dst)
            self._db.execute(
                "INSERT INTO relations (src, type, dst, session) VALUES (?, ?, ?, ?)", (src, r.type, dst, session)
            )
            out.append((fact_id(src), r.type, fact_id(dst)))
        return out

    def _commit_concepts(
        self,
        proposal: Proposal,
        facts: list[FactProposal],
        new: dict[str, int],
        session: int,
        rejected: list[Rejection],
    ) -> int:
        tree = ConceptTree(self._db, session)
        new_nums = set(new.values())

        def num(ref: str) -> int | None:
            if ref in new:
                return new[ref]
            n = fact_num(ref)
            return n if n is not None and self._index.kind(n) is not None else None

        edits = 0
        for edit in proposal.concepts:
            reason = tree.apply(edit, num, new_nums)
            if reason:
                rejected.append(Rejection(f"concept {edit.op} {edit.name!r}", reason))
            else:
                edits += 1
        for f in facts:
            for name in f.concepts:
                if not tree.attach(new[f.key], name):
                    rejected.append(Rejection(f"fact {f.key} in concept {name!r}", "no such concept"))
        return edits

    def _has_session(self, sid: str) -> bool:
        """Whether ``sid`` is stored, whole or in the parts a long session is split into (``SID.p1``, ...)."""
        parts = f"{sid}.p"
        row = self._db.execute(
            "SELECT 1 FROM sessions WHERE id = ? OR substr(id, 1, ?) = ?", (sid, len(parts), parts)
        ).fetchone()
        return row is not None

    def context(self, turns: Sequence[Turn]) -> list[StoredFact]:
        """The stored facts an extractor sees for a session: for each user turn (every turn if there is none) the
        ``context_per_turn`` most similar facts, at most ``context_k`` in all, oldest first."""
        self._sync()
        idx = self._index
        if not idx.n or self.context_k <= 0:
            return []
        texts = [t.content for t in turns if t.role == "user" and t.content.strip()]
        texts = texts or [t.content for t in turns if t.content.strip()]
        if not texts:
            return []
        scores = self.embedder.encode(texts) @ idx.matrix[: idx.n].T  # (turns, facts): rows contiguous
        per = min(self.context_per_turn, idx.n)
        top = np.argpartition(scores, idx.n - per, axis=1)[:, idx.n - per :]
        best: dict[int, float] = {}
        for row, cols in enumerate(top.tolist()):
            for i in cols:
                best[i] = max(best.get(i, -2.0), float(scores[row, i]))
        keep = sorted(best, key=lambda i: -best[i])[: self.context_k]
        return self.facts([fact_id(int(idx.nums[i])) for i in sorted(keep)])

    def _record_relation_rule(self, extractor: Extractor) -> None:
        """Add the extractor's relation rule version to ``meta.relation_rule`` (comma-separated, in first-use order):
        a policy served this store's edges can tell how they were drawn."""
        rule = getattr(extractor, "relation_rule", None) or f"unknown:{type(extractor).__name__}"
        rules = [r for r in (self.meta_value("relation_rule") or "").split(",") if r]
        if rule not in rules:
            self.set_meta_value("relation_rule", ",".join([*rules, rule]))


def _now() -> str:
    return _time.strftime("%Y-%m-%dT%H:%M:%SZ", _time.gmtime())
