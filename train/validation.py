"""Validation during training: does the policy's state help the frozen responder on instances it never trained on?

Every ``eval_steps`` (TRL's ``eval_strategy: steps``; and once more at the last step) the trainer runs TRL's own
evaluation over the validation split (``MemstateTrainArguments.validation_split``, or a fixed seeded subset of it):
states sampled as in training, ``num_generations_eval`` per instance, each rank its shard, rewarded by the same
``CounterfactualGainReward`` (same gates, same responder, baselines from its cache, so after the first pass an
evaluation costs only the with-state prompts). While it runs the reward records one row per completion; afterwards the
rows of all ranks are gathered and summarized (``validation_figures``) into ``eval_*`` figures, logged once per
evaluation to the trainer's log history and every logger (wandb shows them as ``eval/*``). ``train/best.py`` chooses
``best/`` by ``eval_gain``.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

from accelerate.utils import gather_object
from transformers import Trainer, TrainerCallback

from memstate.data import load_split
from memstate.errors import ConfigError
from memstate.evaluate.stats import mean_ci
from memstate.reward.audit import AuditLog
from memstate.schema import Instance

logger = logging.getLogger("memstate.train")

GAIN = "eval_gain"
LEAKED = ("leak", "answer_flow")


def validation_instances(data_dir: str, split: str, max_instances: int | None, seed: int) -> list[Instance] | None:
    """The split's instances, or a fixed subset of ``max_instances`` drawn with ``seed`` (kept in file order);
    None when the data has no such split."""
    try:
        instances = load_split(data_dir, split)
    except FileNotFoundError:
        return None
    except ValueError as e:  # not a split name
        raise ConfigError(f"validation_split: {e}") from None
    if max_instances is not None and max_instances < len(instances):
        keep = sorted(random.Random(seed).sample(range(len(instances)), max_instances))
        instances = [instances[i] for i in keep]
    return instances


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def validation_figures(rows: list[dict], resamples: int = 1000) -> dict[str, float]:
    """The ``eval_*`` figures of one evaluation from its per-completion rows (all ranks'), each instance weighing the
    same whatever its number of completions:

    - ``eval_gain``: mean over instances of their completions' reward, the training reward on held-out instances (a
      gated state at its penalty: a checkpoint cannot win it by leaking); ``eval_gain_ci_low/high``: its 95%
      cluster-bootstrap interval over the instances' split groups (``evaluate/stats.py``). Unscorable completions
      are left out, as TRL leaves them out of the advantage.
    - ``eval_accuracy_no_state`` / ``eval_accuracy_state``: the responder's accuracy with facts only, and with the
      policy's state as deployment would use it (a state that fails the format gate is answered without rules; one
      stopped by the leak or answer-flow gate was never answered and is left out). Closed-form instances only.
    - ``eval_format_rate``, ``eval_leak_rate`` (leak gate and answer-flow check), ``eval_cut_off_rate``,
      ``eval_unscorable_rate``: shares of completions; ``eval_instances``, ``eval_completions``: counts.

    >>> rows = [dict(instance_id=i, group=g, reward=r, gate=gate, cut_off=False, baseline_correct=b,
    ...              with_state_correct=w) for i, g, r, gate, b, w in [
    ...     ("a", "c1", 0.5, "ok", False, True), ("a", "c1", 0.1, "ok", False, False),
    ...     ("b", "c2", -1.0, "format", True, None), ("b", "c2", 0.0, "ok", True, True)]]
    >>> f = validation_figures(rows)
    >>> f["eval_gain"], f["eval_accuracy_no_state"], f["eval_accuracy_state"], f["eval_format_rate"]
    (-0.1, 0.5, 0.75, 0.75)
    >>> f["eval_gain_ci_low"] <= f["eval_gain"] <= f["eval_gain_ci_high"], f["eval_instances"]
    (True, 2)
    """
    per_instance: dict[str, list[dict]] = {}
    for row in rows:
        per_instance.setdefault(row["instance_id"], []).append(row)
    gains, groups, no_state, with_state = [], [], [], []
    for done in per_instance.values():
        gain = _mean([r["reward"] for r in done])
        if gain is not None:
            gains.append(gain)
            groups.append(done[0]["group"])
        no_state.append(done[0]["baseline_correct"])
        answered = [r["baseline_correct"] if r["gate"] == "format" else r["with_state_correct"] for r in done
                    if r["gate"] not in LEAKED]  # fmt: skip
        with_state.append(_mean(answered))
    n = len(rows)
    figures = {
        "eval_instances": len(per_instance),
        "eval_completions": n,
        "eval_accuracy_no_state": _mean(no_state),
        "eval_accuracy_state": _mean(with_state),
        "eval_format_rate": 1 - sum(r["gate"] == "format" for r in rows) / n if n else None,
        "eval_leak_rate": sum(r["gate"] in LEAKED for r in rows) / n if n else None,
        "eval_cut_off_rate": sum(bool(r["cut_off"]) for r in rows) / n if n else None,
        "eval_unscorable_rate": sum(r["gate"] == "ok" and r["reward"] is None for r in rows) / n if n else None,
    }
    ci = mean_ci(gains, groups=groups, n_resamples=resamples)
    if ci is not None:
        figures |= {GAIN: ci.mean, "eval_gain_ci_low": ci.low, "eval_gain_ci_high": ci.high}
    return {k: v for k, v in figures.items() if v is not None}  # loggers take numbers, not None


def attach_validation(trainer: Trainer, reward, audit_dir: Path | None, resamples: int) -> None:
    """Make ``trainer.evaluate`` record the reward's rows, then gather, summarize and log them (every rank logs the
    same figures, so every rank's trainer state can choose the best checkpoint). Completions' audit rows go to
    ``audit_dir`` (one Parquet file per evaluation step and rank), apart from training's."""
    evaluate = trainer.evaluate
    rank = trainer.accelerator.process_index

    def validate(*args, **kwargs) -> dict[str, float]:
        training_audit, before = reward.audit, reward.responder_prompts
        reward.validation = []
        if audit_dir is not None:
            reward.audit = AuditLog(audit_dir, rank)
        try:
            metrics = evaluate(*args, **kwargs)
            rows = reward.validation
        finally:
            reward.validation, reward.audit = None, training_audit
        parts = gather_object([{"rows": rows, "responder_prompts": reward.responder_prompts - before}])
        figures = validation_figures([row for part in parts for row in part["rows"]], resamples)
        figures["eval_responder_prompts"] = sum(part["responder_prompts"] for part in parts)
        # Trainer's own log, not TRL's: TRL's would also flush the pending training metrics of the interval.
        Trainer.log(trainer, dict(figures))  # it adds the epoch to what it is given
        logger.info("validation at step %d: %s", trainer.state.global_step,
                    ", ".join(f"{k[5:]} {v:.3f}" for k, v in figures.items()))  # fmt: skip
        return metrics | figures

    trainer.evaluate = validate


class ValidateAtEnd(TrainerCallback):
    """Evaluate at the last step too (before its save), so the final model competes for ``best/`` with a figure."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= state.max_steps and args.eval_strategy == "steps":
            control.should_evaluate = True
        return control
