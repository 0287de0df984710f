"""The memory store: one SQLite file per user (or per benchmark sample); its schema and migrations.

Tables: ``sessions``; ``facts`` (immutable: triggers refuse UPDATE and DELETE); ``fact_vectors`` (one float32
embedding per fact); ``relations`` between facts (SUPERSEDES / CONFLICTS_WITH, also never rewritten);
``concepts`` (PARENT_OF through ``parent``) and ``concept_facts`` (CONTAINS); ``meta`` (the embedder's name, and
``relation_rule``: the versions of the rules that drew the stored relations, ``memory.relation_rule``, written with
each committed session); ``schema_version``. Whether a fact still holds is derived from the relations, never
written into the fact.

Schema versions are additive: version 2 adds CLAG's cluster organisation (``clag_clusters``, ``clag_members``; see
``memory.clag``); version 3 adds each fact's ``speaker`` and ``source`` (the id of the turn it was drawn from, e.g.
LoCoMo's ``dia_id``: provenance for retrieval benchmarks); version 4 adds the lexical index ``facts_fts`` (SQLite FTS5,
BM25 ranking, Porter stemming) over the facts' texts, filled by a trigger on ``facts`` so that a fact and its index
entry are committed together or not at all (no second file to keep consistent). Opening a store of an older version
upgrades it in place in one transaction (``_MIGRATIONS``); a store of a newer version is refused. Facts, their vectors
and relations stay immutable in every version.

Committing a session (``memory.commit``) and searching (``memory.search``) are mixins of ``MemoryStore``; this
module keeps what both use: the connection and its transactions, the in-memory index, and reading back.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import re
import sqlite3
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from memstate.embedding import Embedder
from memstate.errors import MemstateError
from memstate.memory.commit import CommitMixin
from memstate.memory.dates import fact_day
from memstate.memory.embed import default_embedder, embedder_from_name
from memstate.memory.records import (
    FACT_RELATIONS,
    MEMORY_KINDS,
    MEMORY_SCOPES,
    Concept,
    StoredFact,
    fact_id,
    fact_num,
)
from memstate.memory.search import SearchMixin

logger = logging.getLogger("memstate.memory")

SCHEMA_VERSION = 4
_CHUNK = 900  # ids per IN (…) query


def _sql_list(values: Sequence[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)


_SCHEMA = [
    "CREATE TABLE schema_version (version INTEGER NOT NULL)",
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE sessions (
        num INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        time TEXT,
        n_turns INTEGER NOT NULL,
        first_turn INTEGER NOT NULL,
        extractor TEXT NOT NULL,
        ingested_at TEXT NOT NULL)""",
    f"""CREATE TABLE facts (
        num INTEGER PRIMARY KEY AUTOINCREMENT,
        text TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ({_sql_list(MEMORY_KINDS)})),
        scope TEXT NOT NULL CHECK (scope IN ({_sql_list(MEMORY_SCOPES)})),
        session INTEGER NOT NULL REFERENCES sessions (num),
        turn INTEGER,
        quote TEXT NOT NULL,
        time TEXT)""",
    "CREATE INDEX facts_session ON facts (session)",
    "CREATE TABLE fact_vectors (fact INTEGER PRIMARY KEY REFERENCES facts (num), vec BLOB NOT NULL)",
    f"""CREATE TABLE relations (
        num INTEGER PRIMARY KEY AUTOINCREMENT,
        src INTEGER NOT NULL REFERENCES facts (num),
        type TEXT NOT NULL CHECK (type IN ({_sql_list(FACT_RELATIONS)})),
        dst INTEGER NOT NULL REFERENCES facts (num),
        session INTEGER NOT NULL REFERENCES sessions (num),
        UNIQUE (src, type, dst),
        CHECK (src <> dst))""",
    "CREATE INDEX relations_dst ON relations (dst)",
    """CREATE TABLE concepts (
        num INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        parent INTEGER REFERENCES concepts (num),
        merged_into INTEGER REFERENCES concepts (num),
        session INTEGER NOT NULL REFERENCES sessions (num))""",
    "CREATE UNIQUE INDEX concepts_live_name ON concepts (name) WHERE merged_into IS NULL",
    "CREATE INDEX concepts_name ON concepts (name)",
    """CREATE TABLE concept_facts (
        concept INTEGER NOT NULL REFERENCES concepts (num),
        fact INTEGER NOT NULL REFERENCES facts (num),
        PRIMARY KEY (concept, fact)) WITHOUT ROWID""",
    "CREATE INDEX concept_facts_fact ON concept_facts (fact)",
    *(
        f"CREATE TRIGGER {table}_immutable_{op.lower()} BEFORE {op} ON {table} "
        f"BEGIN SELECT RAISE(ABORT, '{table} are immutable'); END"
        for table in ("facts", "fact_vectors", "relations")
        for op in ("UPDATE", "DELETE")
    ),
]


# Statements that bring a store of version N-1 to version N (applied in order when an older store is opened).
_MIGRATIONS: dict[int, list[str]] = {
    2: [  # CLAG (memory/clag.py): clusters with their profiles, and each fact's current cluster
        """CREATE TABLE clag_clusters (
            num INTEGER PRIMARY KEY,
            parent INTEGER REFERENCES clag_clusters (num),
            origin TEXT NOT NULL CHECK (origin IN ('kmeans', 'new', 'split')),
            summary TEXT NOT NULL,
            tags TEXT NOT NULL,
            profile_source TEXT NOT NULL CHECK (profile_source IN ('llm', 'keywords')),
            centre BLOB NOT NULL,
            retired INTEGER NOT NULL DEFAULT 0 CHECK (retired IN (0, 1)),
            updated_at TEXT NOT NULL)""",
        """CREATE TABLE clag_members (
            fact INTEGER PRIMARY KEY REFERENCES facts (num),
            cluster INTEGER NOT NULL REFERENCES clag_clusters (num),
            router TEXT NOT NULL)""",
        "CREATE INDEX clag_members_cluster ON clag_members (cluster)",
    ],
    3: [  # provenance: who said the fact's turn and the turn's id in its source (NULL for facts stored before)
        "ALTER TABLE facts ADD COLUMN speaker TEXT",
        "ALTER TABLE facts ADD COLUMN source TEXT",
    ],
    4: [  # the lexical index: FTS5 over the facts' texts, filled by a trigger in the inserting transaction itself
        "CREATE VIRTUAL TABLE facts_fts USING fts5(text, content = 'facts', content_rowid = 'num', "
        "tokenize = 'porter unicode61')",
        "INSERT INTO facts_fts (facts_fts) VALUES ('rebuild')",
        "CREATE TRIGGER facts_fts_insert AFTER INSERT ON facts "
        "BEGIN INSERT INTO facts_fts (rowid, text) VALUES (new.num, new.text); END",
    ],
}


class StoreError(MemstateError, RuntimeError):
    """The file is not a memory store this code can use (newer schema, another embedder, mixed dimensions, not a
    SQLite file, damaged, a table missing)."""


def _unreadable(e: sqlite3.Error) -> bool:
    """Whether SQLite's error says the file itself is unusable (not a database, damaged, a table or column of the
    schema gone), as opposed to a transient state of a good store ("database is locked", a full disk) or a bug."""
    if type(e) is sqlite3.DatabaseError:  # "file is not a database", "database disk image is malformed"
        return True
    text = str(e).lower()
    return isinstance(e, sqlite3.OperationalError) and (
        text.startswith(("no such table", "no such column", "no such module")) or "malformed" in text
    )


@contextlib.contextmanager
def readable(path: str | Path) -> Iterator[None]:
    """Turn SQLite's word that ``path`` is not a usable store (random bytes, a truncated or damaged file, a table
    dropped) into one ``StoreError`` naming the file; "database is locked", a full disk and the like keep theirs:
    the store is fine, the moment is not."""
    try:
        yield
    except sqlite3.Error as e:
        if not _unreadable(e):
            raise
        raise StoreError(f"{path}: not a readable memstate store: {e}") from None


# The tables every store of SCHEMA_VERSION has (checked on open: a dropped one is a damaged store, refused then
# rather than a query later failing on it).
_REQUIRED_TABLES = {
    name
    for stmt in (*_SCHEMA, *(s for stmts in _MIGRATIONS.values() for s in stmts))
    for name in re.findall(r"^CREATE (?:VIRTUAL )?TABLE (\w+)", stmt)
}


class _Index:
    """What retrieval and validation read on every call, in memory: embeddings, kinds, the relation graph."""

    def __init__(self) -> None:
        self.n = 0
        self.nums = np.zeros(0, dtype=np.int64)
        self.days = np.zeros(0, dtype=np.int32)  # memory.dates.fact_day of each row (0: no date)
        self.months = np.zeros(0, dtype=np.int8)
        self.matrix: np.ndarray | None = None
        self.row: dict[int, int] = {}
        self.kinds: list[str] = []
        self.last_relation = 0
        self.out: dict[int, list[tuple[str, int]]] = defaultdict(list)
        self.into: dict[int, list[tuple[str, int]]] = defaultdict(list)
        self.edges: set[tuple[int, str, int]] = set()
        self.speakers: set[str] = set()

    @property
    def last_fact(self) -> int:
        return int(self.nums[self.n - 1]) if self.n else 0

    def add_facts(self, nums: list[int], kinds: list[str], vecs: np.ndarray, days: list[int]) -> None:
        if self.matrix is not None and vecs.shape[1] != self.matrix.shape[1]:
            raise StoreError(f"embedding dimension {vecs.shape[1]} differs from the store's {self.matrix.shape[1]}")
        need = self.n + len(nums)
        if self.matrix is None or need > len(self.matrix):  # grow by doubling: appends stay amortized O(1)
            cap = max(need, 2 * (0 if self.matrix is None else len(self.matrix)), 1024)
            matrix = np.zeros((cap, vecs.shape[1]), dtype=np.float32)
            all_nums = np.zeros(cap, dtype=np.int64)
            all_days = np.zeros(cap, dtype=np.int32)
            all_months = np.zeros(cap, dtype=np.int8)
            if self.matrix is not None:
                matrix[: self.n] = self.matrix[: self.n]
                all_nums[: self.n] = self.nums[: self.n]
                all_days[: self.n] = self.days[: self.n]
                all_months[: self.n] = self.months[: self.n]
            self.matrix, self.nums, self.days, self.months = matrix, all_nums, all_days, all_months
        self.matrix[self.n : need] = vecs
        self.nums[self.n : need] = nums
        self.days[self.n : need] = days
        self.months[self.n : need] = [dt.date.fromordinal(d).month if d else 0 for d in days]
        for i, num in enumerate(nums, self.n):
            self.row[num] = i
        self.kinds += kinds
        self.n = need

    def add_relation(self, src: int, rel: str, dst: int) -> None:
        self.out[src].append((rel, dst))
        self.into[dst].append((rel, src))
        self.edges.add((src, rel, dst))

    def kind(self, num: int) -> str | None:
        i = self.row.get(num)
        return None if i is None else self.kinds[i]


BUSY_TIMEOUT_S = 60.0  # how long a writer waits for another process's write transaction


def _set_wal(db: sqlite3.Connection) -> None:
    """WAL mode. Switching a new file's journal mode does not wait on SQLite's busy handler: when several processes
    open a new store at once, all but one are told "database is locked" at once (tests/test_memory_concurrent.py);
    they retry here for as long as a writer would wait."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class MemoryStore(CommitMixin, SearchMixin):
    """One SQLite memory file. ``embedder`` None: the one the store was created with (MiniLM for a new store).

    Use from one thread at a time; several processes may open the same file (one writes at a time)."""

    def __init__(
        self,
        path: str | Path,
        embedder: Embedder | None = None,
        *,
        context_k: int = 32,
        context_per_turn: int = 5,
        create: bool = True,
    ) -> None:
        self.path = Path(path)
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        elif not self.path.is_file():
            raise StoreError(f"{self.path}: no such memory store (`memstate memory ingest` creates one)")
        self.context_k, self.context_per_turn = context_k, context_per_turn
        # create=False: mode=rw, so that a missing file stays missing rather than becoming an empty database
        where, uri = (self.path, False) if create else (self.path.absolute().as_uri() + "?mode=rw", True)
        self._db = sqlite3.connect(where, isolation_level=None, timeout=BUSY_TIMEOUT_S, uri=uri)
        try:
            with readable(self.path):
                if not create:  # before anything that writes: a file that is no store is left as it was
                    self._require_store()
                _set_wal(self._db)
                self._db.execute("PRAGMA synchronous = NORMAL")
                self._db.execute("PRAGMA foreign_keys = ON")
                self.embedder = self._open(embedder, create=create)
                self._index = _Index()
                self.extensions: dict[str, object] = {}  # per-store state of retrieval backends (memory.clag)
                self._sync()
        except BaseException:
            self._db.close()
            raise

    # ---- opening ---------------------------------------------------------------------------------------------

    def _tables(self) -> set[str]:
        return {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def _require_store(self) -> None:
        """Refuse a file that is not a store (``create=False``) without writing to it: an empty file, another
        SQLite database."""
        if "schema_version" not in self._tables():
            what = "an empty file" if self.path.stat().st_size == 0 else "a SQLite file without its tables"
            raise StoreError(f"{self.path}: not a memstate store ({what}; `memstate memory ingest` creates one)")

    def _open(self, embedder: Embedder | None, *, create: bool = True) -> Embedder:
        with self._transaction():
            tables = self._tables()
            has_schema = "schema_version" in tables
            if not has_schema:
                if tables - {"sqlite_sequence"}:  # another program's database: never mix a store into it
                    shown = ", ".join(sorted(tables)[:3]) + (", …" if len(tables) > 3 else "")
                    raise StoreError(f"{self.path}: not a memstate store (a SQLite file with the tables {shown})")
                for stmt in _SCHEMA:
                    self._db.execute(stmt)
                self._db.execute("INSERT INTO schema_version (version) VALUES (1)")
            (version,) = self._db.execute("SELECT version FROM schema_version").fetchone()
            if version > SCHEMA_VERSION:
                raise StoreError(f"{self.path}: schema version {version}, this code reads version {SCHEMA_VERSION}")
            if version < SCHEMA_VERSION:  # additive upgrade, in this same transaction
                for v in range(version + 1, SCHEMA_VERSION + 1):
                    for stmt in _MIGRATIONS[v]:
                        self._db.execute(stmt)
                self._db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
                if has_schema:
                    logger.info("%s: schema upgraded from version %d to %d", self.path, version, SCHEMA_VERSION)
            missing = _REQUIRED_TABLES - self._tables()
            if missing:
                raise StoreError(f"{self.path}: not a readable memstate store: no table {', '.join(sorted(missing))}")
            row = self._db.execute("SELECT value FROM meta WHERE key = 'embedder'").fetchone()
            if row is None and not create and embedder is None:
                raise StoreError(f"{self.path}: meta.embedder is missing: the store does not say which model made it")
            if row is None:
                embedder = embedder if embedder is not None else default_embedder()
                self._db.execute("INSERT INTO meta (key, value) VALUES ('embedder', ?)", (embedder.name,))
                return embedder
        if embedder is None:
            try:
                return embedder_from_name(row[0], label=f"{self.path}: meta.embedder")
            except ValueError as e:  # meta is data anyone can edit: never a traceback or a 373 GiB allocation
                raise StoreError(f"{self.path}: meta.embedder: {e}") from None
        if embedder.name != row[0]:
            raise StoreError(f"{self.path}: the store's vectors come from {row[0]!r}, not {embedder.name!r}")
        return embedder

    @property
    def db(self) -> sqlite3.Connection:
        """The SQLite connection, for backends that keep their own tables (``memstate.memory.clag``); facts, vectors and
        relations refuse UPDATE and DELETE whoever asks."""
        return self._db

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` on the store's connection (all or nothing, one writer at a time)."""
        return self._transaction()

    def meta_value(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_meta_value(self, key: str, value: str) -> None:
        """Write a ``meta`` entry (call inside ``transaction()`` to make it part of a larger commit)."""
        self._db.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = ?",
                         (key, value, value))  # fmt: skip

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """``BEGIN IMMEDIATE`` … ``COMMIT``: one writer at a time, all or nothing."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _sync(self) -> None:
        """Load facts and relations committed since the index was last brought up to date (by anyone)."""
        idx = self._index
        rows = self._db.execute(
            "SELECT f.num, f.kind, v.vec, f.speaker, f.time FROM facts f JOIN fact_vectors v ON v.fact = f.num "
            "WHERE f.num > ? ORDER BY f.num",
            (idx.last_fact,),
        ).fetchall()
        if rows:
            sizes = sorted({len(r[2]) for r in rows})
            if len(sizes) > 1 or sizes[0] == 0 or sizes[0] % 4:  # a damaged or hand-edited file, not a traceback
                raise StoreError(f"{self.path}: fact_vectors: vectors of {sizes[:3]} bytes, not one float32 size")
            vecs = np.frombuffer(b"".join(r[2] for r in rows), dtype=np.float32).reshape(len(rows), -1)
            idx.add_facts([r[0] for r in rows], [r[1] for r in rows], vecs, [fact_day(r[4]) for r in rows])
            idx.speakers.update(r[3] for r in rows if r[3])
        for num, src, rel, dst in self._db.execute(
            "SELECT num, src, type, dst FROM relations WHERE num > ? ORDER BY num", (idx.last_relation,)
        ):
            idx.add_relation(src, rel, dst)
            idx.last_relation = num

    def refresh(self) -> None:
        """See what other processes committed since (retrieval calls this itself)."""
        self._sync()

    # ---- reading ---------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._index.n

    def facts(self, ids: Sequence[str] | None = None) -> list[StoredFact]:
        """Stored facts with their derived state: all (oldest first) or those named by ``ids`` (in that order;
        unknown ids are left out)."""
        if ids is None:
            rows = self._db.execute(_FACT_SELECT + " ORDER BY f.num").fetchall()
        else:
            nums = [n for n in (fact_num(i) for i in ids) if n is not None]
            rows = []
            for start in range(0, len(nums), _CHUNK):
                chunk = nums[start : start + _CHUNK]
                marks = ", ".join("?" * len(chunk))
                rows += self._db.execute(_FACT_SELECT + f" WHERE f.num IN ({marks})", chunk).fetchall()
            order = {n: i for i, n in enumerate(nums)}
            rows.sort(key=lambda r: order[r[0]])
        concepts = self._concepts_of([r[0] for r in rows] if ids is not None else None)
        return [self._stored_fact(r, concepts.get(r[0], ())) for r in rows]

    def _concepts_of(self, nums: list[int] | None) -> dict[int, tuple[str, ...]]:
        sql = "SELECT cf.fact, c.name FROM concept_facts cf JOIN concepts c ON c.num = cf.concept"
        out: dict[int, list[str]] = defaultdict(list)
        if nums is None:
            for fact, name in self._db.execute(sql + " ORDER BY c.name"):
                out[fact].append(name)
        else:
            for start in range(0, len(nums), _CHUNK):
                chunk = nums[start : start + _CHUNK]
                marks = ", ".join("?" * len(chunk))
                for fact, name in self._db.execute(sql + f" WHERE cf.fact IN ({marks}) ORDER BY c.name", chunk):
                    out[fact].append(name)
        return {k: tuple(v) for k, v in out.items()}

    def _stored_fact(self, row: tuple, concepts: tuple[str, ...]) -> StoredFact:
        num, text, kind, scope, turn, quote, time, session, speaker, source = row
        idx = self._index
        out, into = idx.out.get(num, ()), idx.into.get(num, ())
        return StoredFact(
            id=fact_id(num),
            text=text,
            kind=kind,
            scope=scope,
            quote=quote,
            session=session,
            turn=turn,
            time=time,
            concepts=concepts,
            supersedes=tuple(fact_id(d) for r, d in out if r == "SUPERSEDES"),
            superseded_by=tuple(fact_id(s) for r, s in into if r == "SUPERSEDES"),
            conflicts_with=tuple(
                dict.fromkeys(fact_id(o) for r, o in (*out, *into) if r == "CONFLICTS_WITH")  # either direction
            ),
            speaker=speaker,
            source=source,
        )

    def relations(self) -> list[tuple[str, str, str]]:
        """Every stored ``(src, type, dst)`` in commit order."""
        rows = self._db.execute("SELECT src, type, dst FROM relations ORDER BY num")
        return [(fact_id(s), t, fact_id(d)) for s, t, d in rows]

    def sessions(self) -> list[str]:
        """Committed session ids in commit order."""
        return [r[0] for r in self._db.execute("SELECT id FROM sessions ORDER BY num")]

    def concepts(self) -> list[Concept]:
        """The live concepts (retired ones are merged away), by name."""
        names = dict(self._db.execute("SELECT num, name FROM concepts"))
        members: dict[int, list[str]] = defaultdict(list)
        for concept, fact in self._db.execute("SELECT concept, fact FROM concept_facts ORDER BY fact"):
            members[concept].append(fact_id(fact))
        rows = self._db.execute("SELECT num, name, parent FROM concepts WHERE merged_into IS NULL ORDER BY name")
        return [Concept(name, names.get(parent), tuple(members.get(num, ()))) for num, name, parent in rows]

    def stats(self) -> dict[str, int]:
        """Counts and the file's size on disk (with its WAL)."""
        count = {t: self._db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("sessions", "relations")}
        size = sum(p.stat().st_size for p in (self.path, Path(f"{self.path}-wal")) if p.exists())
        n_concepts = self._db.execute("SELECT COUNT(*) FROM concepts WHERE merged_into IS NULL").fetchone()[0]
        return {"facts": len(self), **count, "concepts": n_concepts, "bytes": size}

    # ---- retrieval primitives --------------------------------------------------------------------------------

    def texts(self, nums: Sequence[int]) -> dict[int, str]:
        """``{fact number: text}`` for stored facts (unknown numbers left out)."""
        out: dict[int, str] = {}
        nums = [int(n) for n in nums]
        for start in range(0, len(nums), _CHUNK):
            chunk = nums[start : start + _CHUNK]
            marks = ", ".join("?" * len(chunk))
            out.update(self._db.execute(f"SELECT num, text FROM facts WHERE num IN ({marks})", chunk).fetchall())
        return out

    def links(self, ref: str) -> list[tuple[str, str, str]]:
        """The stored relations touching fact ``ref``, as ``(src, type, dst)``: outgoing, then incoming."""
        n = fact_num(ref)
        if n is None:
            return []
        idx = self._index
        return [(ref, r, fact_id(d)) for r, d in idx.out.get(n, ())] + [
            (fact_id(s), r, ref) for r, s in idx.into.get(n, ())
        ]

    def following(self, refs: Sequence[str]) -> dict[str, str]:
        """For each fact of ``refs``, the next fact stored from the same session (the reply to a turn, or the next
        piece of a long one), where there is one."""
        nums = [n for n in map(fact_num, refs) if n is not None]
        if not nums:
            return {}
        rows = self._db.execute(
            "SELECT f.num, (SELECT MIN(g.num) FROM facts g WHERE g.session = f.session AND g.num > f.num "
            f"AND g.num <= ?) FROM facts f WHERE f.num IN ({', '.join('?' * len(nums))})",
            (self._index.last_fact, *nums),
        )
        return {fact_id(n): fact_id(nxt) for n, nxt in rows if nxt is not None}

    def is_superseded(self, ref: str) -> bool:
        n = fact_num(ref)
        return any(r == "SUPERSEDES" for r, _ in self._index.into.get(n, ()))

    # ---- lifetime --------------------------------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Fold the WAL into the main file (for measuring its size, or before copying it)."""
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_FACT_SELECT = (
    "SELECT f.num, f.text, f.kind, f.scope, f.turn, f.quote, f.time, s.id, f.speaker, f.source "
    "FROM facts f JOIN sessions s ON s.num = f.session"
)
