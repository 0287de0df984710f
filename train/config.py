"""Training arguments: memstate's own fields next to TRL's ``GRPOConfig``, both read from one YAML by ``TrlParser``."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig, TrlParser


@dataclass
class MemstateTrainArguments:
    """What to train, on what data, rewarded by which responder. GRPO hyperparameters live in ``GRPOConfig``."""

    policy_model: str = field(
        metadata={"help": "Policy to train: a local path or hub id (tiny: runs/tiny-models/policy)."}
    )
    responder_model: str = field(metadata={"help": "Frozen responder that measures the answer gain (in-process)."})
    data_dir: str = field(metadata={"help": "Built Instance dataset (memstate build-data output)."})
    train_split: str = field(default="train", metadata={"help": "Split to train on."})
    max_train_instances: int | None = field(default=None, metadata={"help": "Use only the first N instances."})
    reward_mode: str = field(default="likelihood", metadata={"help": "Counterfactual score mode (likelihood)."})
    format_penalty: float = field(default=-1.0, metadata={"help": "Reward of a state that fails parse_state."})
    leak_penalty: float = field(default=-1.0, metadata={"help": "Reward of a state that contains the answer."})
    responder_batch_size: int = field(default=32, metadata={"help": "Prompts per responder forward pass."})
    format_warmup_steps: int = field(
        default=0,
        metadata={
            "help": "Supervised steps on template states (format only, never answers) before GRPO. A random-init "
            "tiny policy cannot write the '- rule' format, so every state would get the same format penalty and "
            "GRPO would see zero advantage; instruct models follow the format from the prompt and need 0."
        },
    )
    format_warmup_learning_rate: float = field(default=1e-3, metadata={"help": "Learning rate of the warm-up."})


def parse_train_args(argv: list[str] | None = None) -> tuple[MemstateTrainArguments, GRPOConfig]:
    """``--config FILE.yaml`` plus ``--field value`` overrides, as every TRL script reads them."""
    parser = TrlParser((MemstateTrainArguments, GRPOConfig))
    script_args, grpo_config = parser.parse_args_and_config(argv)
    return script_args, grpo_config
