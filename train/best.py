"""Keep the best checkpoint: by validation gain, else by training reward.

The last checkpoint of an RL run need not be its best. With a validation split evaluated every ``eval_steps``
(``train/validation.py``), each saved checkpoint is scored by the validation gain measured at its step
(``eval_gain``: the reward on instances the policy never trained on). Without one, by the mean training reward
logged over the steps since the previous save (its window; TRL logs the reward averaged over each logging interval):
measured on the prompts being fitted, under the policy as it was then, so a checkpoint can win it by overfitting or
by a lucky window. The best is recorded in the trainer state (``best_metric``, ``best_global_step``,
``best_model_checkpoint``), where transformers' checkpoint rotation keeps it and ``--resume`` finds it, and at the
end the run exports it as ``best/`` next to ``final/`` (``train/run.py``); ``best.json`` says which score chose it
(``selected_by``) and lists every checkpoint's figures.
"""

from __future__ import annotations

import math
from pathlib import Path

from transformers import TrainerCallback

METRIC = "reward"
VALIDATION_METRIC = "eval_gain"


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


def validation_at(log_history: list[dict], step: int) -> dict | None:
    """The validation figures logged at ``step`` (the last evaluation there), or None.

    >>> validation_at([{"step": 4, "eval_gain": 0.1}, {"step": 8, "loss": 1.0}, {"step": 8, "eval_gain": 0.2}], 8)
    {'step': 8, 'eval_gain': 0.2}
    """
    found = [e for e in log_history if e.get("step") == step and VALIDATION_METRIC in e]
    return found[-1] if found else None


def checkpoint_score(log_history: list[dict], step: int, interval: int, by_validation: bool) -> float | None:
    """A checkpoint's score: the validation gain at its step, or the windowed training reward up to it."""
    if by_validation:
        figures = validation_at(log_history, step)
        return None if figures is None else figures[VALIDATION_METRIC]
    return window_mean(log_history, step - interval + 1, step)


class BestCheckpointCallback(TrainerCallback):
    """Scores every checkpoint as it is saved (by validation gain when ``by_validation``, else by the windowed training
    reward) and records the best one in the trainer state."""

    def __init__(self, by_validation: bool = False) -> None:
        self.by_validation = by_validation

    def on_save(self, args, state, control, **kwargs):
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        score = checkpoint_score(state.log_history, state.global_step, save_interval(args), self.by_validation)
        if score is None or (state.best_metric is not None and score <= state.best_metric):
            return
        state.best_metric, state.best_global_step, state.best_model_checkpoint = score, state.global_step, str(ckpt)
        if state.is_world_process_zero and ckpt.is_dir():
            # The checkpoint's trainer_state.json was written before this callback ran: bring it up to date, so
            # that --resume from it knows the best so far.
            state.save_to_json(str(ckpt / "trainer_state.json"))
