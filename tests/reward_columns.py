"""The dataset columns TRL hands a reward function, built from Instances (shared by the reward tests)."""

from __future__ import annotations


def columns(instances) -> dict[str, list]:
    """``{column: [value per instance]}``, as ``GRPOTrainer`` passes the dataset's columns as keyword arguments."""
    return {k: [inst.to_dict()[k] for inst in instances] for k in instances[0].to_dict()}
