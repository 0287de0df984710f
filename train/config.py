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
    responder_model: str = field(
        metadata={
            "help": "Frozen responder that measures the answer gain: a local path/hub id loaded in-process, or, "
            "with responder_url, the model name the server serves."
        }
    )
    data_dir: str = field(metadata={"help": "Built Instance dataset (memstate build-data output)."})
    train_split: str = field(default="train", metadata={"help": "Split to train on."})
    max_train_instances: int | None = field(default=None, metadata={"help": "Use only the first N instances."})
    reward_mode: str = field(default="likelihood", metadata={"help": "Score mode: likelihood (dense) or exact."})
    format_penalty: float = field(default=-1.0, metadata={"help": "Reward of a state that fails parse_state."})
    leak_penalty: float = field(default=-1.0, metadata={"help": "Reward of a state that contains the answer."})
    responder_url: str | None = field(
        default=None, metadata={"help": "OpenAI-compatible endpoint of the responder (vllm serve), e.g. http://h:8000"}
    )
    responder_api_key_env: str | None = field(
        default=None, metadata={"help": "Environment variable holding the endpoint's API key, if it needs one."}
    )
    responder_concurrency: int = field(default=64, metadata={"help": "HTTP requests in flight at once."})
    responder_timeout: float = field(default=120.0, metadata={"help": "Seconds per HTTP request."})
    responder_max_retries: int = field(default=4, metadata={"help": "Retries per HTTP request before giving up."})
    responder_batch_size: int = field(default=32, metadata={"help": "Prompts per forward pass (in-process)."})
    baseline_cache: str | None = field(
        default=None,
        metadata={"help": "SQLite file of no-state baselines, shared by runs (fill it with precompute-baselines)."},
    )
    format_warmup_steps: int = field(
        default=0,
        metadata={
            "help": "Supervised steps on template states (format only, never answers) before GRPO. A random-init "
            "tiny policy cannot write the '- rule' format, so every state would get the same format penalty and "
            "GRPO would see zero advantage; instruct models follow the format from the prompt and need 0."
        },
    )
    format_warmup_learning_rate: float = field(default=1e-3, metadata={"help": "Learning rate of the warm-up."})
    max_prompt_tokens: int = field(
        default=8192,
        metadata={"help": "Policy prompt budget: facts are dropped from the end to fit; the question never is."},
    )
    use_peft: bool = field(default=False, metadata={"help": "Train LoRA adapters (peft) instead of all weights."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha (scale = alpha / r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        metadata={"help": "Modules that get adapters (Qwen3 names)."},
    )
    lora_modules_to_save: list[str] = field(
        default_factory=list,
        metadata={"help": "Modules trained in full next to the adapters (peft modules_to_save), e.g. lm_head."},
    )


def parse_train_args(argv: list[str] | None = None) -> tuple[MemstateTrainArguments, GRPOConfig]:
    """``--config FILE.yaml`` plus ``--field value`` overrides, as every TRL script reads them."""
    parser = TrlParser((MemstateTrainArguments, GRPOConfig))
    script_args, grpo_config = parser.parse_args_and_config(argv)
    return script_args, grpo_config
