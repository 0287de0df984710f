"""The reward's audit trail: one row per scored completion, so a run's leak attempts can be read after the fact.

A row says which instance, the state as written (the completion text), the gate's decision (``ok``, ``format``,
``leak`` or ``answer_flow``) and why (the FormatError reason, the leak gate's reason, or the answer-flow shift
against its threshold), the answer-flow shift (None when not computed), the no-state baseline score, the with-state
score (None when gated or unscorable), the gain (with-state minus baseline score) and the reward credited for it (the
gain less the answer-flow shift by default; the penalty when gated; None when unscorable).

``AuditLog`` writes a step's rows of one rank to ``DIR/step-NNNNNN-rankR.parquet``. ``NNNNNN`` is the optimizer step
the completions train: TRL's ``trainer_state.global_step`` when they are scored, plus one, the step that
``log_history`` and TRL's ``completions/completions_NNNNN.parquet`` give them. Several reward calls in one step
(``steps_per_generation`` below ``gradient_accumulation_steps``) add to that step's rows and the file is rewritten
whole, atomically (a step's rows of a rank are at most its generation batch); a step redone after a resume replaces
its file.
"""

from __future__ import annotations

import os
from pathlib import Path

AUDIT_COLUMNS = (
    "instance_id",
    "state",
    "gate",
    "gate_reason",
    "answer_flow_shift",
    "baseline_score",
    "with_state_score",
    "gain",
    "reward",
)
GATES = ("ok", "format", "leak", "answer_flow")


def audit_schema():
    import pyarrow as pa

    text, number = pa.string(), pa.float64()
    return pa.schema(
        [("step", pa.int64()), ("rank", pa.int32())]
        + [(c, number if c.endswith(("shift", "score")) or c in ("gain", "reward") else text) for c in AUDIT_COLUMNS]
    )


def audit_file(directory: str | Path, step: int, rank: int) -> Path:
    """Where a step's rows of one rank go.

    >>> audit_file("runs/x/audit", 123, 0).name
    'step-000123-rank0.parquet'
    """
    return Path(directory) / f"step-{step:06d}-rank{rank}.parquet"


class AuditLog:
    """Per-step Parquet files of audit rows (dicts with ``AUDIT_COLUMNS``) under ``directory``, for process ``rank``."""

    def __init__(self, directory: str | Path, rank: int = 0):
        self.directory = Path(directory)
        self.rank = rank
        self._step: int | None = None
        self._rows: list[dict] = []

    def write(self, step: int, rows: list[dict]) -> Path:
        """Add ``rows`` to ``step``'s rows and (re)write its file; returns the file."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if step != self._step:
            self._step, self._rows = step, []
        self._rows += [{"step": step, "rank": self.rank, **{c: row[c] for c in AUDIT_COLUMNS}} for row in rows]
        self.directory.mkdir(parents=True, exist_ok=True)
        path = audit_file(self.directory, step, self.rank)
        tmp = path.with_name(f".{path.name}.tmp")
        pq.write_table(pa.Table.from_pylist(self._rows, schema=audit_schema()), tmp)
        os.replace(tmp, path)
        return path
