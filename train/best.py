"""Keep the best checkpoint by training reward.

GRPO has no held-out loss to select on (transformers' ``load_best_model_at_end`` needs an eval set), and the last
checkpoint of an RL run need not be its best. Each saved checkpoint is scored by the mean training reward logged
over the steps since the previous save (its window; TRL logs the reward averaged over each logging interval), the
best one is recorded in the trainer state (``best_metric``, ``best_global_step``, ``best_model_checkpoint``), where
transformers' checkpoint rotation keeps it and ``--resume`` finds it, and at the end the run exports it as ``best/``
next to ``final/`` (``train/run.py``); ``best.json`` reports both.
"""

from __future__ import annotations

import math
from pathlib import Path

from transformers import TrainerCallback

METRIC = "reward"


def save_interval(args) -> int:
    """Steps between saves: ``save_steps``, or a fraction of ``max_steps`` when below 1 (transformers' rule)."""
    if args.save_steps < 1:
        return max(math.ceil(args.max_steps * args.save_steps), 1)
    return int(args.save_steps)


def window_mean(log_history: list[dict], first_step: int, last_step: int) -> float | None:
    """Mean of the logged training reward over steps ``first_step..last_step`` (None if none was logged).

    >>> window_mean([{"step": 10, "reward": -0.5}, {"step": 20, "reward": -0.3}, {"step": 20, "loss": 1.0}], 11, 20)
    -0.3
    """
    values = [e[METRIC] for e in log_history if METRIC in e and first_step <= e["step"] <= last_step]
    return sum(values) / len(values) if values else None


def checkpoint_scores(log_history: list[dict], steps: list[int], interval: int) -> dict[int, float | None]:
    """Each checkpoint step's score: the mean logged reward over the ``interval`` steps up to it.

    >>> h = [{"step": s, "reward": r} for s, r in [(10, -0.9), (20, -0.5), (30, -0.7), (40, -0.6)]]
    >>> checkpoint_scores(h, [20, 40], 20)
    {20: -0.7, 40: -0.6499999999999999}
    """
    return {step: window_mean(log_history, step - interval + 1, step) for step in steps}


class BestCheckpointCallback(TrainerCallback):
    """Scores every checkpoint as it is saved and records the best one in the trainer state."""

    def on_save(self, args, state, control, **kwargs):
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        score = window_mean(state.log_history, state.global_step - save_interval(args) + 1, state.global_step)
        if score is None or (state.best_metric is not None and score <= state.best_metric):
            return
        state.best_metric, state.best_global_step, state.best_model_checkpoint = score, state.global_step, str(ckpt)
        if state.is_world_process_zero and ckpt.is_dir():
            # The checkpoint's trainer_state.json was written before this callback ran: bring it up to date, so
            # that --resume from it knows the best so far.
            state.save_to_json(str(ckpt / "trainer_state.json"))
