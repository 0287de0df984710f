"""``memstate train``: memstate's own fields, the responder's (``ResponderConfig``) and TRL's ``GRPOConfig``, all
read from one flat YAML by ``TrlParser``; any field can follow on the command line as ``--field value``."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Literal

from memstate.reward.answer_flow import DEFAULT_THRESHOLD
from trl import GRPOConfig

from memstate.data import load_split
from memstate.errors import ConfigError
from memstate.parsing import StageParser
from memstate.prompts import DEFAULT_MAX_PROMPT_TOKENS
from memstate.responder_config import ResponderConfig


@dataclass
class MemstateTrainArguments:
    """What to train and on what data. The responder that rewards it is a ``ResponderConfig``, the GRPO
    hyperparameters a ``GRPOConfig``."""

    policy_model: str = field(
        metadata={"help": "Policy to train: a local path or hub id (tiny: runs/tiny-models/policy)."}
    )
    data_dir: str = field(metadata={"help": "Built Instance dataset (memstate build-data output)."})
    train_split: str = field(default="train", metadata={"help": "Split to train on."})
    max_train_instances: int | None = field(default=None, metadata={"help": "Use only the first N instances."})
    format_penalty: float = field(default=-1.0, metadata={"help": "Reward of a state that fails parse_state."})
    leak_penalty: float = field(default=-1.0, metadata={"help": "Reward of a state that contains the answer."})
    answer_flow_check: bool = field(
        default=False,
        metadata={
            "help": "Answer-flow check (reward/answer_flow.py): each state that passed the format and leak gates is "
            "also scored with no memory shown; one that raises any candidate's probability by more than "
            "answer_flow_threshold carries the answer, whatever its words, and gets leak_penalty. One responder "
            "prompt per new state and one per new request, cached (in baseline_cache's file when set)."
        },
    )
    answer_flow_threshold: float = field(
        default=DEFAULT_THRESHOLD,
        metadata={
            "help": "Largest rise, over all candidates, of the responder's probability that a state may cause with "
            "no memory shown, in [0, 1). Provisional default, to be calibrated."
        },
    )
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
    format_warmup_lr_scheduler_type: str = field(
        default="linear",
        metadata={"help": "Schedule of the warm-up's rate (a transformers scheduler name); decaying it lets the "
                  "last steps settle the format instead of leaving it noisy."},
    )  # fmt: skip
    max_prompt_tokens: int = field(
        default=DEFAULT_MAX_PROMPT_TOKENS,
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
    shared_prefix_training: bool = field(
        default=True,
        metadata={
            "help": "Encode each group's prompt once in the policy's training forward/backward, the old-policy and "
            "the reference log-probs, its completions attending to it through a 4-D mask (train/shared_prefix.py): "
            "P + G*R tokens a group instead of G*(P + R), same log-probs and gradients. Micro-batches then hold "
            "whole groups. Falls back to TRL's path, logged, for attention kernels without 4-D masks "
            "(flash_attention_*, flex_attention), sliding-window models, multimodal inputs and MoE aux loss."
        },
    )
    shared_prefix_check: Literal["off", "logps", "gradients"] = field(
        default="logps",
        metadata={
            "help": "First-use self-check of the shared-prefix path against TRL's on the live batch: per-token "
            "log-probs ('logps'), also parameter gradients ('gradients'; not under DeepSpeed), or none ('off'). A "
            "mismatch turns the path off for the run, logged."
        },
    )
    shared_prefix_check_tolerance: float | None = field(
        default=None,
        metadata={
            "help": "Largest mean |log-prob difference| the check accepts (default: 1e-4 in fp32, 2e-2 in bf16, "
            "1e-2 in fp16)."
        },
    )
    check_vllm_weights: bool = field(
        default=False,
        metadata={
            "help": "use_vllm with vllm_mode colocate: after every weight sync compare each of vLLM's parameters with "
            "the policy's (cast to vLLM's dtype; fused q/k/v and gate/up) and stop at any difference; logs "
            "vllm_sync/* metrics. Costs a full parameter comparison per sync: for CI and debugging "
            "(train/vllm_sync.py)."
        },
    )

    def __post_init__(self) -> None:
        if not 0.0 <= self.answer_flow_threshold < 1.0:
            raise ConfigError(f"answer_flow_threshold must be in [0, 1), got {self.answer_flow_threshold}")


def load_train_instances(script_args: MemstateTrainArguments) -> list:
    """The training split (first ``max_train_instances``); a data_dir without it is a ``ConfigError``."""
    try:
        instances = load_split(script_args.data_dir, script_args.train_split)
    except FileNotFoundError as e:
        raise ConfigError(f"data_dir: {e}") from None
    return instances[: script_args.max_train_instances] if script_args.max_train_instances else instances


def check_vllm_settings(script_args: MemstateTrainArguments, config: GRPOConfig, *, on_cpu: bool) -> None:
    """Refuse vLLM settings that cannot work, before any model loads.

    A colocated engine gets ``vllm_max_model_length`` as its context (TRL passes it to vLLM's ``max_model_len``);
    unset, vLLM takes the model's own maximum (262,144 tokens for Qwen3-4B-Instruct-2507) and sizes its KV cache for
    it, which does not fit beside the trainer in a fraction of a GPU. It must hold a prompt at the budget plus a whole
    completion. Sleep mode (freeing vLLM's memory during the optimizer step) exists only on GPUs.
    """
    if not config.use_vllm or config.vllm_mode != "colocate":
        return  # server mode: the context is the `trl vllm-serve` command's --max-model-len
    budget = script_args.max_prompt_tokens + config.max_completion_length
    if config.vllm_max_model_length is None:
        raise ConfigError(
            "vllm_mode colocate needs vllm_max_model_length (otherwise vLLM sizes its KV cache for the model's whole "
            f"context): set it to max_prompt_tokens + max_completion_length = {budget}"
        )
    if config.vllm_max_model_length < budget:
        raise ConfigError(
            f"vllm_max_model_length {config.vllm_max_model_length} is below max_prompt_tokens "
            f"{script_args.max_prompt_tokens} + max_completion_length {config.max_completion_length} = {budget}: "
            "vLLM would refuse prompts at the budget"
        )
    if on_cpu and config.vllm_enable_sleep_mode:
        raise ConfigError("vllm_enable_sleep_mode: vLLM has no sleep mode on CPU; set it to false for CPU runs")


class TrainParser(StageParser):
    """``--dry-run`` relaxes only device and precision, so a GPU config validates on CPU (the arithmetic does not
    use them)."""

    def parse_args_and_config(self, args: list[str] | None = None, **kwargs) -> tuple:  # type: ignore[override]
        args = list(args or [])
        if "--dry-run" in args or "--dry_run" in args:
            args += ["--use_cpu", "true", "--bf16", "false"]
        return super().parse_args_and_config(args, **kwargs)


def make_parser(prog: str | None = None) -> TrainParser:
    parser = TrainParser(
        (MemstateTrainArguments, ResponderConfig, GRPOConfig),
        prog=prog,
        description="GRPO-train the policy. --config FILE.yaml (flat keys: the fields below), then any field as "
        "--field value to override the file, e.g. --config configs/train/tiny_cpu.yaml --max_steps 2.",
    )
    parser.add_argument("--resume", action="store_true", help="Continue from the last checkpoint in output_dir.")
    parser.add_argument(
        "--dry-run",
        "--dry_run",
        action="store_true",
        help="Validate config, data and tokenizer without loading weights; print the batch arithmetic.",
    )
    parser.add_argument(
        "--world-size", "--world_size", type=int, help="Processes the dry run assumes (default: $WORLD_SIZE or 1)."
    )
    return parser


def parse_train_args(argv: list[str] | None = None) -> tuple[MemstateTrainArguments, ResponderConfig, GRPOConfig]:
    """``--config FILE.yaml`` plus ``--field value`` overrides, as every TRL script reads them."""
    script_args, responder, grpo_config, *_ = make_parser().parse_args_and_config(argv)
    return script_args, responder, grpo_config


def run(parsed: tuple[MemstateTrainArguments, ResponderConfig, GRPOConfig, argparse.Namespace]) -> None:
    script_args, responder, grpo_config, options = parsed
    if not responder.responder_model:
        raise ConfigError("responder_model is required (the frozen responder that measures the answer gain)")
    # A dry run forces use_cpu (TrainParser) to validate a GPU config anywhere: its device settings are not checked.
    check_vllm_settings(script_args, grpo_config, on_cpu=grpo_config.use_cpu and not options.dry_run)
    if options.dry_run:
        from memstate.train.dry_run import dry_run

        world_size = options.world_size or int(os.environ.get("WORLD_SIZE", 1))
        report = dry_run(script_args, grpo_config, world_size)
        width = max(map(len, report))
        for key, value in report.items():
            print(f"{key:<{width}}  {value}")
        return
    from memstate.train.run import train

    final = train(script_args, responder, grpo_config, resume=options.resume)
    print(f"final model: {final}")
