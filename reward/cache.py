"""Baseline cache: Score(A(q, M_q), y*) does not depend on the state, so it is computed once per responder request
and shared by all candidates, steps, epochs, runs and processes.

The key is content-addressed: a sha256 of the exact no-state request (the chat messages as sent, the scored
continuations or decoding settings, the reference the reply is scored against, the mode) and of the responder's
``identity``. Instance ids are not part of it: they survive a rebuild of the dataset with another seed, templates or
distractors, while the prompt behind them changes. The instance id, responder, prompt version and mode are stored
next to the hash for people reading the table; lookups use the hash only.

SQLite in WAL mode: several training processes (one per rank) read and write the same file safely; a write is a
single ``INSERT OR IGNORE`` (the first value wins, so concurrent writers never disagree about what is cached).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import NamedTuple

from memstate.reward.judge import EXACT_MAX_NEW_TOKENS, Judgement

from memstate.prompts import PROMPT_VERSION, responder_messages
from memstate.schema import Instance, option_letters


class CacheKey(NamedTuple):
    """``digest`` is what is looked up; the other fields are labels stored for inspection."""

    digest: str
    instance_id: str
    responder: str
    prompt_version: str
    mode: str


# A new table name: rows of the old id-keyed ``baselines`` table in an existing file can never be served.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS baseline_scores (
    digest TEXT PRIMARY KEY,
    instance_id TEXT NOT NULL,
    responder TEXT NOT NULL,
    prompt_version TEXT NOT NULL,
    mode TEXT NOT NULL,
    score REAL NOT NULL,
    correct INTEGER,
    answer TEXT
)
"""


def request_digest(payload: dict) -> str:
    """sha256 (hex) of a canonical JSON of ``payload`` (sorted keys, no whitespace), so equal content hashes equally.

    >>> request_digest({"a": 1, "b": ["x"]}) == request_digest({"b": ["x"], "a": 1})
    True
    """
    canonical = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def connect(path: Path, schema: str) -> sqlite3.Connection:
    """A connection to the cache file ``path`` (created with its folder if missing) in WAL mode with a 60 s busy
    timeout, autocommit, usable from any thread, after running ``schema`` (``CREATE TABLE IF NOT EXISTS …``). Every
    table of the file (baselines, answer-flow probabilities) is opened so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=60.0, check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA busy_timeout=60000")
    db.execute(schema)
    return db


def baseline_request(instance: Instance, mode: str) -> dict:
    """Everything the no-state judgement of ``instance`` depends on besides the responder (mirrors reward.judge):
    the messages as sent, the scored continuations (likelihood) or the decoding settings (exact), and the reference
    the reply is scored against (the correct letter is not in the request, yet it decides the score)."""
    closed = bool(instance.candidates)
    request: dict = {"mode": mode, "messages": responder_messages(instance, None)}
    if mode == "likelihood":
        request["continuations"] = option_letters(len(instance.candidates)) if closed else [instance.answer]
    else:
        request["decoding"] = {"greedy": True, "max_new_tokens": EXACT_MAX_NEW_TOKENS}
    request["reference"] = instance.answer_letter if closed else instance.answer
    return request


def baseline_key(instance: Instance, mode: str, responder_identity: str) -> CacheKey:
    """The cache key of ``instance``'s no-state baseline: used by training and precompute alike."""
    digest = request_digest({"request": baseline_request(instance, mode), "responder": responder_identity})
    return CacheKey(digest, instance.id, responder_identity, PROMPT_VERSION, mode)


class BaselineCache:
    """In memory by default; on disk (SQLite) when given a path. ``hits``/``misses`` count lookups."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else None
        self.hits = 0
        self.misses = 0
        self._memory: dict[str, Judgement] = {}  # by digest
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        if self.path:
            self._db = connect(self.path, _SCHEMA)

    def get_many(self, keys: list[CacheKey]) -> dict[CacheKey, Judgement]:
        todo = {k.digest for k in keys if k.digest not in self._memory}
        if todo and self._db is not None:
            with self._lock:
                for digest in todo:
                    row = self._db.execute(
                        "SELECT score, correct, answer FROM baseline_scores WHERE digest=?", (digest,)
                    ).fetchone()
                    if row is not None:
                        self._memory[digest] = Judgement(row[0], None if row[1] is None else bool(row[1]), row[2])
        found = {k: self._memory[k.digest] for k in keys if k.digest in self._memory}
        self.hits += len(found)
        self.misses += len(keys) - len(found)
        return found

    def put_many(self, items: dict[CacheKey, Judgement]) -> None:
        for key, judgement in items.items():
            self._memory.setdefault(key.digest, judgement)  # first value wins, as in the database
        if self._db is not None and items:
            rows = [(*k, j.score, None if j.correct is None else int(j.correct), j.answer) for k, j in items.items()]
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")  # one transaction for the batch, not one per row
                self._db.executemany("INSERT OR IGNORE INTO baseline_scores VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
                self._db.execute("COMMIT")

    def __len__(self) -> int:
        if self._db is not None:
            with self._lock:
                return self._db.execute("SELECT COUNT(*) FROM baseline_scores").fetchone()[0]
        return len(self._memory)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
