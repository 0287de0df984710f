"""Baseline cache: Score(A(q, M_q), y*) does not depend on the state, so it is computed once per responder request
and shared by all candidates, steps, epochs, runs and processes.

The key is content-addressed: a sha256 of the exact no-state request (the chat messages as sent, the scored
continuations or decoding settings, the reference the reply is scored against, the mode) and of the responder's
``identity``. Instance ids are not part of it: they survive a rebuild of the dataset with another seed, templates or
distractors, while the prompt behind them changes. The instance id, responder, prompt version and mode are stored
next to the hash for people reading the table; lookups use the hash only.

On disk the cache is a SQLite file, opened one of two ways (``open_training_cache`` picks one for training):

- **read-write**: WAL mode on the file itself; several processes of one host read and write it safely; a write is a
  single ``INSERT OR IGNORE`` (the first value wins, so concurrent writers never disagree about what is cached). WAL
  needs all processes on one host and a local filesystem (its index is a memory-mapped ``-shm`` file): not across
  nodes, not on NFS, Lustre, GPFS...
- **read-only**: the file, filled beforehand by the single-process ``memstate reward precompute-baselines`` (which
  leaves it self-contained: no ``-wal``), is copied once per node to node-local disk and the copy is opened
  ``mode=ro&immutable=1`` (no lock, no ``-shm``, nothing written anywhere); what it lacks is computed and kept in the
  process's memory. The shared file is never modified.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from memstate.errors import ConfigError
from memstate.filesystem import Mount, network_mount, read_mount_table
from memstate.prompts import PROMPT_VERSION
from memstate.reward.responder_score import Judgement, responder_request
from memstate.schema import Instance

logger = logging.getLogger("memstate.reward")

ACCESS_MODES = ("auto", "read-only", "read-write")


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


def connect_read_only(path: Path, table: str) -> sqlite3.Connection | None:
    """A read-only connection to ``path`` opened ``mode=ro&immutable=1``: SQLite takes no lock and makes no ``-shm``
    or ``-wal`` file, so the file must not change while it is open (a node-local copy). ``None`` when the file has no
    ``table`` (a file written before that table existed): the caller then keeps everything in memory."""
    uri = f"{Path(path).resolve().as_uri()}?mode=ro&immutable=1"
    db = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
    try:
        found = db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)).fetchone()
    except sqlite3.DatabaseError as e:
        db.close()
        raise ConfigError(f"baseline_cache {path}: not a readable SQLite cache file ({e})") from None
    if found is None:
        db.close()
        return None
    return db


def close_self_contained(db: sqlite3.Connection, path: Path | None) -> None:
    """Fold the WAL into the file and leave it in rollback-journal mode, so that the file alone is the whole cache
    (a byte copy of it is complete) and no ``-wal``/``-shm`` file stays next to it; the next read-write opener turns
    WAL on again. Another process with the file open prevents it: logged, and the file stays usable in WAL mode."""
    try:
        db.execute("PRAGMA busy_timeout=2000")  # not a minute: another process holding the file will not let go
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        mode = db.execute("PRAGMA journal_mode=DELETE").fetchone()[0]
    except sqlite3.OperationalError as e:
        mode = f"unchanged ({e})"
    if mode != "delete":
        logger.warning(
            "%s: still in WAL mode, %s: another process has it open; training copies it read-only only once no "
            "-wal file is left",
            path,
            mode,
        )


def baseline_key(instance: Instance, mode: str, responder_identity: str) -> CacheKey:
    """The cache key of ``instance``'s no-state baseline: used by training and precompute alike."""
    request = responder_request(instance, None, mode).key()
    digest = request_digest({"request": request, "responder": responder_identity})
    return CacheKey(digest, instance.id, responder_identity, PROMPT_VERSION, mode)


class BaselineCache:
    """In memory by default; on disk (SQLite) when given a path: read-write (WAL, shared by the processes of one
    host), or with ``read_only`` a file that does not change (a node-local copy: see ``open_training_cache``), whose
    misses are then kept in memory only. ``hits``/``misses`` count lookups."""

    def __init__(self, path: str | Path | None = None, *, read_only: bool = False):
        self.path = Path(path) if path else None
        self.read_only = bool(read_only and self.path)
        self.hits = 0
        self.misses = 0
        self._memory: dict[str, Judgement] = {}  # by digest
        self._unsaved: set[str] = set()  # read-only: digests put here that the file does not hold
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        if self.path:
            read_only = self.read_only
            self._db = connect_read_only(self.path, "baseline_scores") if read_only else connect(self.path, _SCHEMA)

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
        if self.read_only:  # memory only; the first value wins, as in the file
            with self._lock:
                for key, judgement in items.items():
                    if key.digest not in self._memory and not self._in_file(key.digest):
                        self._memory[key.digest] = judgement
                        self._unsaved.add(key.digest)
            return
        for key, judgement in items.items():
            self._memory.setdefault(key.digest, judgement)  # first value wins, as in the database
        if self._db is not None and items:
            rows = [(*k, j.score, None if j.correct is None else int(j.correct), j.answer) for k, j in items.items()]
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")  # one transaction for the batch, not one per row
                self._db.executemany("INSERT OR IGNORE INTO baseline_scores VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
                self._db.execute("COMMIT")

    def _in_file(self, digest: str) -> bool:
        return self._db is not None and (
            self._db.execute("SELECT 1 FROM baseline_scores WHERE digest=?", (digest,)).fetchone() is not None
        )

    def __len__(self) -> int:
        if self._db is not None:
            with self._lock:
                return self._db.execute("SELECT COUNT(*) FROM baseline_scores").fetchone()[0] + len(self._unsaved)
        return len(self._memory)

    def close(self, *, self_contained: bool = False) -> None:
        """With ``self_contained`` (precompute-baselines, when done) a read-write file is left complete on its own:
        no ``-wal`` file, so it can be copied for read-only training (``close_self_contained``)."""
        if self._db is not None:
            if self_contained and not self.read_only:
                close_self_contained(self._db, self.path)
            self._db.close()
            self._db = None


def default_local_dir() -> Path:
    """Where read-only copies go by default: ``$SLURM_TMPDIR``, else ``$TMPDIR``, else ``/tmp`` (node-local on
    clusters), in a per-user ``memstate-<uid>`` folder (a shared ``/tmp`` must not hold another user's folder)."""
    base = os.environ.get("SLURM_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    return Path(base) / f"memstate-{os.getuid()}"


def local_world_size_from_env() -> int | None:
    """Processes on this node, as the launchers say it (torchrun/accelerate, DeepSpeed, Open MPI); ``None`` if none
    does."""
    for name in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def choose_access(
    access: str, network: Mount | None, world_size: int, local_world_size: int | None, path: str | Path
) -> tuple[str, str]:
    """``("read-write" | "read-only", why)`` for a cache file on ``network`` (``None``: a local filesystem) used by
    ``world_size`` processes, ``local_world_size`` of them on this node (``None``: unknown). Refuses (``ConfigError``)
    a read-write file that WAL cannot serve.

    >>> choose_access("auto", None, 1, None, "c.sqlite")
    ('read-write', 'auto: a single process on a local filesystem')
    >>> choose_access("auto", None, 8, 8, "c.sqlite")
    ('read-only', 'auto: 8 processes')
    """
    if access not in ACCESS_MODES:
        raise ConfigError(f"baseline_cache_access {access!r} is not one of {list(ACCESS_MODES)}")
    where = f"a network filesystem ({network.fstype} at {network.point})" if network else "a local filesystem"
    if access == "read-only":
        return "read-only", "baseline_cache_access: read-only"
    if access == "auto":
        if network is None and world_size <= 1:
            return "read-write", "auto: a single process on a local filesystem"
        return "read-only", f"auto: on {where}" if network else f"auto: {world_size} processes"
    if network is not None:
        raise ConfigError(
            f"baseline_cache {path} is on {where}, where SQLite's WAL mode (baseline_cache_access: read-write) "
            "fails: copy it to node-local disk, or use baseline_cache_access: read-only"
        )
    if world_size > 1 and (local_world_size is None or local_world_size < world_size):
        nodes = (
            "an unknown number of nodes (no LOCAL_WORLD_SIZE)"
            if local_world_size is None
            else f"{-(-world_size // local_world_size)} nodes"
        )
        raise ConfigError(
            f"baseline_cache_access: read-write with {world_size} processes on {nodes}: SQLite's WAL mode needs all "
            "processes on one host; use baseline_cache_access: read-only (or auto)"
        )
    return "read-write", f"baseline_cache_access: read-write, {world_size} process(es) on one node, {where}"


def refuse_unfinished(source: Path) -> None:
    """A ``-wal`` (or hot ``-journal``) file next to ``source`` holds part of the cache: a byte copy would miss it."""
    for suffix in ("-wal", "-journal"):
        side = source.with_name(source.name + suffix)
        if side.exists():
            raise ConfigError(
                f"baseline_cache {source}: {side.name} is there, so the file is not complete on its own: "
                "precompute-baselines (or a read-write training run) is still writing it, or crashed; let it finish, "
                "or rerun precompute-baselines on it (it resumes, and leaves a self-contained file when done)"
            )


@contextlib.contextmanager
def _node_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path``: the processes of one node copy a file once, the others wait for it.
    Where flock is not available, no lock (the copy is atomic anyway, only made more than once)."""
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:
            pass
        yield


def node_local_copy(source: str | Path, local_dir: str | Path) -> tuple[Path, bool]:
    """``(copy, made)``: a byte copy of the finished cache file ``source`` in ``local_dir``, named by a digest of the
    source's resolved path, size and modification time, written to a temporary name and renamed (``os.replace``): no
    process (of this job or a concurrent one) ever reads a half-written copy. ``made`` is False when an identical
    copy was already there."""
    source = Path(source).expanduser().resolve()
    if not source.is_file():
        raise ConfigError(
            f"baseline_cache {source}: no such file; fill it first with `memstate reward precompute-baselines` "
            "(read-only access never creates it)"
        )
    refuse_unfinished(source)
    before = source.stat()
    tag = request_digest({"path": str(source), "size": before.st_size, "mtime_ns": before.st_mtime_ns})[:16]
    local_dir = Path(local_dir).expanduser()
    target = local_dir / f"{source.stem}-{tag}{source.suffix or '.sqlite'}"

    def present() -> bool:
        return target.is_file() and target.stat().st_size == before.st_size

    if present():
        return target, False
    tmp: str | None = None
    try:
        local_dir.mkdir(parents=True, exist_ok=True)
        with _node_lock(local_dir / f".{target.name}.lock"):
            if present():  # another process of this node made it while we waited
                return target, False
            fd, tmp = tempfile.mkstemp(dir=local_dir, prefix=f".{target.name}.", suffix=".part")
            with os.fdopen(fd, "wb") as out, source.open("rb") as src:
                shutil.copyfileobj(src, out, 16 << 20)
                out.flush()
                os.fsync(out.fileno())
            after = source.stat()
            if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
                raise ConfigError(
                    f"baseline_cache {source} changed while it was copied to {local_dir}: is precompute-baselines or "
                    "a read-write training run writing to it? Let it finish first"
                )
            refuse_unfinished(source)
            os.replace(tmp, target)
            tmp = None
    except OSError as e:
        raise ConfigError(
            f"baseline_cache {source}: copying it to {local_dir} failed ({e}); set baseline_cache_local_dir to a "
            "node-local directory with room for it"
        ) from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return target, True


def open_training_cache(
    path: str | Path | None,
    access: str = "auto",
    local_dir: str | Path | None = None,
    world_size: int = 1,
    *,
    local_world_size: int | None = None,
    mount_table: Callable[[], str | None] = read_mount_table,
) -> BaselineCache:
    """The baseline cache of one training process (rank): in memory without ``path``; else the file read-write, or a
    node-local read-only copy of it (``choose_access``: ``access`` is ``auto``, ``read-only`` or ``read-write``).
    ``world_size`` is the number of training processes, ``local_world_size`` those on this node (default: the
    launcher's environment), ``local_dir`` where copies go (default ``default_local_dir()``). The answer-flow cache
    of the reward follows the returned cache's ``path`` and ``read_only``."""
    if not path:
        return BaselineCache()
    source = Path(path).expanduser()
    if local_world_size is None:
        local_world_size = local_world_size_from_env()
    network = network_mount(source, mount_table)
    mode, why = choose_access(access, network, world_size, local_world_size, source)
    if mode == "read-write":
        logger.info("baseline_cache %s: read-write (SQLite WAL on the file itself; %s)", source, why)
        return BaselineCache(source)
    local_dir = Path(local_dir) if local_dir else default_local_dir()
    if (remote := network_mount(local_dir, mount_table)) is not None:
        logger.warning(
            "baseline_cache_local_dir %s is on a network filesystem (%s at %s): read-only copies work there, but "
            "every node reads over the network; set baseline_cache_local_dir to node-local disk", local_dir,
            remote.fstype, remote.point,
        )  # fmt: skip
    copy, made = node_local_copy(source, local_dir)
    cache = BaselineCache(copy, read_only=True)
    logger.info(
        "baseline_cache %s: read-only (%s); reading the node-local copy %s (%s, %d baselines); new baselines and "
        "answer-flow probabilities stay in this process's memory",
        source, why, copy, "copied now" if made else "already there", len(cache),
    )  # fmt: skip
    return cache
