"""Stop on request with a checkpoint: a file whose appearance ends the run after the current optimizer step.

SLURM kills a job at its time limit; with ``#SBATCH --signal=B:USR1@N`` it first signals the batch script, which
creates the file. Every rank must stop at the same step (a rank that stops alone hangs the others in the next
collective), and a shared filesystem may show the file to one node before another, so rank 0 decides for all: one
1-element all-reduce per step.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch
from accelerate.utils import reduce
from transformers import TrainerCallback

from memstate.errors import MemstateError

logger = logging.getLogger("memstate.train")


class StopFileCallback(TrainerCallback):
    """Save and stop after the step in which ``path`` appeared on rank 0; ``stopped_at`` is that step (or None)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.stopped_at: int | None = None

    def on_step_end(self, args, state, control, **kwargs):
        seen = state.is_world_process_zero and self.path.exists()
        # Zero everywhere but rank 0, summed: every rank gets rank 0's decision.
        decision = reduce(torch.tensor([float(seen)], device=args.device), reduction="sum")
        if decision.item() > 0:
            logger.warning("%s appeared: saving a checkpoint at step %d and stopping", self.path, state.global_step)
            self.stopped_at = state.global_step
            control.should_save = True
            control.should_training_stop = True
        return control


class TrainingStopped(MemstateError, RuntimeError):
    """The run stopped before its end with a checkpoint to resume from (``stopped.json`` in the output dir says why)."""

    hint = "rerun the same command with --resume once the cause is gone"


def write_stopped(output_dir: Path, reason: str, step: int, checkpoint: Path, **details) -> None:
    """``stopped.json``: why and where a run stopped early (and any ``details``), for people and the launch script."""
    record = {"reason": reason, "step": step, "checkpoint": str(checkpoint), "time": time.strftime("%FT%T%z")}
    record |= details
    (Path(output_dir) / "stopped.json").write_text(json.dumps(record, indent=2) + "\n")
