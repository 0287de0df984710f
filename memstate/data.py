"""Reading a built Instance dataset (``{split}.parquet`` + ``manifest.json``), for every stage after data_build; and
the bounds every reader of an input file applies to one record (``read_lines``, ``loads_record``, ``text_problem``).

Record bounds: a line longer than ``max_record_bytes()`` (default ``MAX_RECORD_BYTES``, 4 MiB, or
``MEMSTATE_MAX_RECORD_BYTES``; ``max_record_bytes("context")`` for formats whose lines run to megabytes, PersonaMem's
shared contexts: ``MAX_CONTEXT_BYTES``, 64 MiB, or ``MEMSTATE_MAX_CONTEXT_BYTES``) is refused without being held in
memory; JSON nested deeper than the
parser recurses is invalid JSON, not a ``RecursionError``; a string with a lone surrogate (a ``"\\ud800"`` escape
without its pair) is not text.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from memstate.schema import Instance

SPLITS = ("train", "validation", "test")


def split_path(data_dir: str | Path, split: str) -> Path:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {list(SPLITS)}")
    return Path(data_dir) / f"{split}.parquet"


def load_split(data_dir: str | Path, split: str) -> list[Instance]:
    """All instances of one split; a bad row raises ``SchemaError`` naming the file, row and field."""
    path = split_path(data_dir, split)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such split file; build the data first (memstate build-data)")
    from datasets import Dataset  # here: the record helpers below are imported by light commands (memory ask)

    # A throwaway cache dir: rows are kept in memory, and a rebuilt file can never hit a stale cache entry.
    with tempfile.TemporaryDirectory(prefix="memstate-load-") as cache_dir:
        rows = Dataset.from_parquet(str(path), keep_in_memory=True, cache_dir=cache_dir)
        return [Instance.from_dict(row, f"{path} row {i}") for i, row in enumerate(rows)]


def manifest_sha256(data_dir: str | Path) -> str | None:
    """sha256 of the dataset's manifest.json: identifies exactly which build a checkpoint or report used."""
    path = Path(data_dir) / "manifest.json"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


# ---- one record of an input file -------------------------------------------------------------------------------------

# The largest real records are far below these: FEVER claim and wiki-page lines, SciFact claims and abstracts and
# MemSyco rows are kilobytes; PersonaMem's shared-context lines are ~0.2 MB (32k) to several MB (1M variant).
MAX_RECORD_BYTES = 4 << 20
MAX_CONTEXT_BYTES = 64 << 20
_LIMIT_ENV = {"record": ("MEMSTATE_MAX_RECORD_BYTES", MAX_RECORD_BYTES),
              "context": ("MEMSTATE_MAX_CONTEXT_BYTES", MAX_CONTEXT_BYTES)}  # fmt: skip


def max_record_bytes(kind: str = "record") -> int:
    """The byte limit of one record (a line) of ``kind`` "record" or "context" (PersonaMem shared contexts): the
    environment variable's value when set, else the default. A bad value is a ``ConfigError``."""
    from memstate.errors import ConfigError

    name, default = _LIMIT_ENV[kind]
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        limit = int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r}: not a whole number of bytes") from None
    if limit < 1:
        raise ConfigError(f"{name}={value!r}: must be at least 1 byte")
    return limit


def over_limit_reason(size: int, limit: int, kind: str = "record") -> str:
    """What a reader says about a line of ``size`` bytes over ``limit``."""
    return f"line of {size} bytes is over the {limit}-byte limit of one record (raise it with {_LIMIT_ENV[kind][0]})"


def read_lines(
    f: IO[bytes], limit: int, consume: Callable[[bytes], Any] | None = None
) -> Iterator[tuple[int, bytes | None, int]]:
    """``(line number, line, size in bytes)`` for every line of a binary file; ``line`` is None for a line over
    ``limit`` bytes (line ending not counted), whose bytes are read in chunks and dropped, never held whole.
    ``consume`` gets every byte read, dropped ones included (a running sha256)."""
    lineno = 0
    while True:
        raw = f.readline(limit + 2)  # room for "\r\n" after a line of exactly ``limit`` bytes
        if not raw:
            return
        lineno += 1
        if consume is not None:
            consume(raw)
        if len(raw.rstrip(b"\r\n")) <= limit:
            yield lineno, raw, len(raw)
            continue
        size = len(raw)
        while not raw.endswith(b"\n"):
            raw = f.readline(1 << 20)
            if not raw:
                break
            size += len(raw)
            if consume is not None:
                consume(raw)
        yield lineno, None, size


def loads_record(text: str | bytes, **kwargs: Any) -> Any:
    """``json.loads``, with JSON nested too deeply for the parser raised as ``json.JSONDecodeError`` (like any other
    invalid JSON) instead of ``RecursionError``."""
    try:
        return json.loads(text, **kwargs)
    except RecursionError:
        doc = text if isinstance(text, str) else ""
        raise json.JSONDecodeError("nested too deeply", doc, 0) from None


_SURROGATE = re.compile("[\ud800-\udfff]")


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be written as UTF-8, or None: a lone surrogate (JSON's ``"\\ud800"`` without its pair),
    or a byte that was not UTF-8 (Python's surrogate escape of command-line arguments: U+DC80–U+DCFF).

    >>> text_problem("ok ✓"), text_problem("a\\ud800b")
    (None, 'lone surrogate U+D800 at character 2 (not valid Unicode text)')
    >>> text_problem("x\\udcff")
    'byte 0xff at character 2 is not valid UTF-8'
    """
    m = _SURROGATE.search(text)
    if m is None:
        return None
    code = ord(m.group())
    if 0xDC80 <= code <= 0xDCFF:
        return f"byte 0x{code - 0xDC00:02x} at character {m.start() + 1} is not valid UTF-8"
    return f"lone surrogate U+{code:04X} at character {m.start() + 1} (not valid Unicode text)"


def find_text_problem(value: Any, where: str = "") -> tuple[str, str] | None:
    """``(field path, reason)`` of the first string in a JSON-like value (keys included) that ``text_problem``
    refuses, or None. Paths read ``facts[2].text``."""
    if isinstance(value, str):
        reason = text_problem(value)
        return None if reason is None else (where or "(value)", reason)
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            if isinstance(key, str) and (reason := text_problem(key)) is not None:
                return path, f"key: {reason}"
            if (found := find_text_problem(item, path)) is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            if (found := find_text_problem(item, f"{where}[{i}]")) is not None:
                return found
    return None
