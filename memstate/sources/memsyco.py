"""MemSyco-Bench, as released: one JSONL file per task, every line a row validated against the benchmark's
``schema.json`` (draft 2020-12, by ``jsonschema_rs``; by default the one beside the data file). A row, shortened::

    {"id": "v11_000321", "task": "valid_memory_selection", "dialogue": [{"role": "user", "content": "…"}, …],
     "question": "…", "memory": {"policy": "update", "items": [{"content": "…", "type": "preference",
     "status": "outdated"}, …]}, "evaluation": {"reference_answer": "…", "rubric": {…}},
     "metadata": {"source_id": …, "subtype": …, "topic": …}}

``load_memsyco(path)`` reads one file (blank lines skipped; ids unique), ``load_memsyco_dir`` every ``*.jsonl`` of a
directory (ids unique across files). The first bad line raises ``MemSycoError`` with
``FILE:LINE: field PATH: reason`` (PATH like ``memory.items[0].status``). The one reader of the format: ``evaluate``
maps rows to Instances (``memstate.evaluate.memsyco``), ``memory`` ingests their dialogues.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema_rs

from memstate.data import loads_record, max_record_bytes, over_limit_reason, read_lines
from memstate.errors import InputError


class MemSycoError(InputError):
    """A MemSyco-Bench file or row that cannot be used; the message is ``FILE:LINE: field PATH: reason``."""


@dataclass(frozen=True)
class MemSycoRow:
    """One validated row, kept whole (``raw``), with where it came from."""

    raw: dict[str, Any]
    file: str
    line: int

    @property
    def id(self) -> str:
        return self.raw["id"]

    @property
    def task(self) -> str:
        return self.raw["task"]

    @property
    def dialogue(self) -> list[dict[str, str]]:
        return self.raw["dialogue"]

    @property
    def question(self) -> str:
        return self.raw["question"]

    @property
    def memory_policy(self) -> str:
        return self.raw["memory"]["policy"]

    @property
    def memory_items(self) -> list[dict[str, str]]:
        return self.raw["memory"]["items"]

    @property
    def evaluation(self) -> dict[str, Any]:
        return self.raw["evaluation"]

    @property
    def rubric(self) -> dict[str, Any]:
        return self.raw["evaluation"]["rubric"]

    @property
    def metadata(self) -> dict[str, Any]:
        return self.raw["metadata"]

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@functools.lru_cache(maxsize=8)
def _validator(schema_path: str) -> Any:
    try:
        schema = json.loads(Path(schema_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise MemSycoError(f"{schema_path}: cannot read the MemSyco-Bench schema: {e}") from None
    return jsonschema_rs.validator_for(schema)


def field_path(parts: Sequence[str | int]) -> str:
    """A JSON instance path as ``memory.items[0].status``.

    >>> field_path(["memory", "items", 0, "status"]), field_path([])
    ('memory.items[0].status', '(row)')
    """
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(row)"


def _describe(error: Any) -> str:
    path, kind = list(error.instance_path), error.kind
    name = type(kind).__name__
    if name == "Required":  # the path is the parent object's: name the missing field itself
        return f"field {field_path([*path, kind.property])}: required field is missing"
    if name == "AdditionalProperties":
        return f"field {field_path([*path, kind.unexpected[0]])}: not a field of the MemSyco-Bench schema"
    return f"field {field_path(path)}: {error.message}"


def load_memsyco(path: str | Path, schema: str | Path | None = None) -> list[MemSycoRow]:
    """Every row of one MemSyco-Bench JSONL file, validated against ``schema`` (default: ``schema.json`` beside it).

    Blank lines are skipped; the first bad line raises ``MemSycoError`` naming ``FILE:LINE`` and the field."""
    path = Path(path)
    validator = _validator(str(Path(schema) if schema else path.parent / "schema.json"))
    rows: list[MemSycoRow] = []
    seen: dict[str, int] = {}
    try:
        f = open(path, "rb")
    except OSError as e:
        raise MemSycoError(f"{path}: cannot read: {e.strerror}") from None
    limit = max_record_bytes()
    with f:
        lines = list(read_lines(f, limit))
    for lineno, data, size in lines:
        where = f"{path}:{lineno}"
        if data is None:  # over the limit: not read whole
            raise MemSycoError(f"{where}: {over_limit_reason(size, limit)}")
        if not data.strip():
            continue
        try:
            raw = loads_record(data.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise MemSycoError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        except json.JSONDecodeError as e:
            raise MemSycoError(f"{where}: invalid JSON: {e.msg} (column {e.colno})") from None
        error = next(iter(validator.iter_errors(raw)), None)
        if error is not None:
            raise MemSycoError(f"{where}: {_describe(error)}")
        if raw["id"] in seen:
            raise MemSycoError(f"{where}: field id: {raw['id']!r} is already the id of line {seen[raw['id']]}")
        seen[raw["id"]] = lineno
        rows.append(MemSycoRow(raw, str(path), lineno))
    return rows


def memsyco_files(paths: Sequence[str | Path]) -> list[Path]:
    """The JSONL files named by ``paths``: files as given, directories as their ``*.jsonl`` (sorted)."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.jsonl"))
            if not found:
                raise MemSycoError(f"{p}: no *.jsonl files")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise MemSycoError(f"{p}: no such file or directory")
    return files


def check_unique_ids(rows: Sequence[MemSycoRow]) -> None:
    """Raise ``MemSycoError`` at the first row whose id an earlier row (of any file) already has."""
    seen: dict[str, str] = {}
    for row in rows:
        if row.id in seen:
            raise MemSycoError(f"{row.where}: field id: {row.id!r} is already the id of {seen[row.id]}")
        seen[row.id] = row.where


def load_memsyco_dir(path: str | Path, schema: str | Path | None = None) -> list[MemSycoRow]:
    """Every row of every ``*.jsonl`` file in a directory (ids unique across files)."""
    rows = [row for file in memsyco_files([path]) for row in load_memsyco(file, schema)]
    check_unique_ids(rows)
    return rows
