"""What the data build's source readers hand the builder: claim records and per-source accounting.

Skipped records (``SkipLog``, ``DataError``, the skip kinds) are the format readers' bookkeeping:
``memstate.sources.skips``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EvidenceClaim:
    """A claim from an objective source (FEVER, SciFact), normalized and with its evidence resolved.

    ``evidence`` holds the gold evidence sentences as fact texts ("Title: sentence"); it is empty for a
    ``not enough info`` claim, whose ``context`` holds sentences that were retrieved for it but do not decide it
    (SciFact: the cited abstracts); when that is empty too, the builder samples unrelated evidence.
    """

    source: str
    claim_id: str
    claim: str
    label: str  # one of memstate.data_build.labels.LABELS
    evidence: tuple[str, ...]
    context: tuple[str, ...] = ()
    file: str = ""  # path relative to the source dir, for meta
    line: int = 0
    meta: dict = field(default_factory=dict)  # extra JSON-compatible provenance (source ids, evidence refs…)

    @property
    def group(self) -> str:
        """Split group key: the source claim."""
        return f"{self.source}:{self.claim_id}"


@dataclass
class SourceRead:
    """What one source reader returns. Skipped records go to the shared ``SkipLog``, so per file:
    ``records_in[f] == records_used[f] + (skipped records of f)`` — the builder checks it."""

    source: str
    items: list  # EvidenceClaim (FEVER, SciFact) or Instance (PersonaMem)
    records_in: dict[str, int] = field(default_factory=dict)  # file → records (lines/rows) read
    records_used: dict[str, int] = field(default_factory=dict)  # file → records that produced items
    inputs: list[dict] = field(default_factory=list)  # {"path", "sha256", "size", "kind"} of every file read
    stats: dict = field(default_factory=dict)  # source-specific counts for the manifest
    stopped_at: dict | None = None  # set when a cap stopped reading early: {"file", "next_line"}
