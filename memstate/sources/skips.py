"""Skipped records, shared by every source reader: strict vs ``--skip-invalid``.

Every record a reader reads is either used or skipped with its file, 1-based line/row and a reason naming the
field; nothing is dropped silently. By default the reading stops at the first structural error (``DataError``);
with ``skip_invalid`` it goes on and ``SkipLog.records`` lists every skipped record (the data build's manifest).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from memstate.errors import MemstateError

# Skip kinds, so the manifest can count skips by cause. The structural ones stop a strict build.
SKIP_INVALID = "invalid_record"  # unparsable line/row, missing field, wrong type, unknown label
SKIP_UNRESOLVED = "unresolved_evidence"  # evidence points at a page/document/sentence the inputs lack
SKIP_DUPLICATE = "duplicate_record"  # the same source id twice
SKIP_UNLABELED = "unlabeled"  # well-formed but carries no label to build an instance from (SciFact test claims)
SKIP_NO_HISTORY = "no_user_history"  # well-formed, but the question's history has no user turn (PersonaMem)
SKIP_CONFLICTING = "conflicting_labels"  # well-formed, but its rationales disagree on the label (SciFact)
STRUCTURAL_KINDS = frozenset({SKIP_INVALID, SKIP_UNRESOLVED, SKIP_DUPLICATE})


class DataError(MemstateError, ValueError):
    """A structural error in an input file; the message names the file, line/row and field."""


@dataclass(frozen=True)
class Skipped:
    """A record that was read but not used."""

    file: str
    line: int
    reason: str
    kind: str
    record_id: str | None = None

    def to_dict(self) -> dict:
        """The manifest's entry: ``where`` is ``FILE:LINE``, as an error about the record would name it."""
        d = {"where": f"{self.file}:{self.line}", "file": self.file, "line": self.line, "reason": self.reason,
             "kind": self.kind}  # fmt: skip
        if self.record_id is not None:
            d["record_id"] = self.record_id
        return d


@dataclass
class SkipLog:
    """Collects skipped records; raises ``DataError`` on a structural one unless ``skip_invalid``.

    >>> log = SkipLog(skip_invalid=False)
    >>> log.skip("claims.jsonl", 3, "field 'label' is 'MAYBE'", SKIP_UNLABELED)
    >>> try:
    ...     log.skip("claims.jsonl", 4, "field 'claim' is missing", SKIP_INVALID)
    ... except DataError as e:
    ...     print(e)
    claims.jsonl:4: field 'claim' is missing (rerun with --skip-invalid to skip it)
    """

    skip_invalid: bool = False
    records: list[Skipped] = field(default_factory=list)

    def skip(self, file: str, line: int, reason: str, kind: str, record_id: object = None) -> None:
        if kind in STRUCTURAL_KINDS and not self.skip_invalid:
            raise DataError(f"{file}:{line}: {reason} (rerun with --skip-invalid to skip it)")
        self.records.append(Skipped(str(file), line, reason, kind, None if record_id is None else str(record_id)))


def input_record(path: Path, kind: str) -> dict:
    """The manifest's record of an input file: path, sha256 (read in chunks), size and kind."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {"path": str(path), "sha256": h.hexdigest(), "size": path.stat().st_size, "kind": kind}
