"""Baseline cache: Score(A(q, M_q), y*) does not depend on the state, so it is computed once per
(instance, responder, prompt version, mode) and shared by all candidates, steps, epochs, runs and processes.

SQLite in WAL mode: several training processes (one per rank) read and write the same file safely; a write is a
single ``INSERT OR IGNORE`` (the first value wins, so concurrent writers never disagree about what is cached).
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from reward.judge import Judgement

CacheKey = tuple[str, str, str, str]  # (instance id, responder name, prompt version, mode)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS baselines (
    instance_id TEXT NOT NULL,
    responder TEXT NOT NULL,
    prompt_version TEXT NOT NULL,
    mode TEXT NOT NULL,
    score REAL NOT NULL,
    correct INTEGER,
    answer TEXT,
    PRIMARY KEY (instance_id, responder, prompt_version, mode)
)
"""


class BaselineCache:
    """In memory by default; on disk (SQLite) when given a path. ``hits``/``misses`` count lookups."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else None
        self.hits = 0
        self.misses = 0
        self._memory: dict[CacheKey, Judgement] = {}
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=60.0, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA busy_timeout=60000")
            self._db.execute(_SCHEMA)

    def get_many(self, keys: list[CacheKey]) -> dict[CacheKey, Judgement]:
        found = {k: self._memory[k] for k in keys if k in self._memory}
        todo = [k for k in keys if k not in found]
        if todo and self._db is not None:
            with self._lock:
                for key in todo:
                    row = self._db.execute(
                        "SELECT score, correct, answer FROM baselines "
                        "WHERE instance_id=? AND responder=? AND prompt_version=? AND mode=?",
                        key,
                    ).fetchone()
                    if row is not None:
                        found[key] = self._memory[key] = Judgement(
                            row[0], None if row[1] is None else bool(row[1]), row[2]
                        )
        self.hits += len(found)
        self.misses += len(keys) - len(found)
        return found

    def put_many(self, items: dict[CacheKey, Judgement]) -> None:
        for key, judgement in items.items():
            self._memory.setdefault(key, judgement)  # first value wins, as in the database
        if self._db is not None and items:
            rows = [(*k, j.score, None if j.correct is None else int(j.correct), j.answer) for k, j in items.items()]
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")  # one transaction for the batch, not one per row
                self._db.executemany("INSERT OR IGNORE INTO baselines VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
                self._db.execute("COMMIT")

    def __len__(self) -> int:
        if self._db is not None:
            with self._lock:
                return self._db.execute("SELECT COUNT(*) FROM baselines").fetchone()[0]
        return len(self._memory)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
