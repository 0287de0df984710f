"""``memstate train``: memstate's own fields, the responder's (``ResponderConfig``) and TRL's ``GRPOConfig``, all
read from one flat YAML by ``TrlParser``; any field can follow on the command line as ``--field value``."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Literal

from trl import GRPOConfig

from memstate.data import load_split
from memstate.errors import ConfigError
from memstate.parsing import StageParser
from memstate.prompts import DEFAULT_MAX_PROMPT_TOKENS
from memstate.responders import ResponderConfig
from memstate.reward.answer_flow import DEFAULT_THRESHOLD
from memstate.reward.responder_score import score_mode


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
    validation_split: str = field(
        default="validation",
        metadata={
            "help": "Split evaluated every eval_steps when eval_strategy is 'steps' (TRL's eval_dataset; "
            "train/validation.py): states sampled as in training (num_generations_eval each), rewarded by the same "
            "reward, logged as eval_* (eval/* in wandb); best/ is the checkpoint with the highest validation gain. "
            "A data_dir without this split: no validation, best/ by training reward (logged)."
        },
    )
    max_validation_instances: int | None = field(
        default=None,
        metadata={
            "help": "Validate on a fixed subset of this many instances of validation_split, drawn with validation_seed "
            "(the same at every evaluation and on resume). Each evaluation costs num_generations_eval responder "
            "prompts per instance (twice that with answer_flow_check), plus one baseline per instance the first time."
        },
    )
    validation_seed: int | None = field(
        default=None,
        metadata={
            "help": "Seed of that subset (default: seed). Fix it when comparing runs of several seeds, so that every "
            "run validates on the same instances."
        },
    )
    validation_bootstrap_resamples: int = field(
        default=1000, metadata={"help": "Resamples of the validation gain's cluster-bootstrap 95% CI."}
    )
    format_penalty: float = field(default=-1.0, metadata={"help": "Reward of a state that fails parse_state."})
    leak_penalty: float = field(default=-1.0, metadata={"help": "Reward of a state that contains the answer."})
    answer_flow_check: bool = field(
        default=True,
        metadata={
            "help": "Answer-flow check (reward/answer_flow.py): each state that passed the format and leak gates is "
            "also scored with no memory shown; one whose shift exceeds answer_flow_threshold carries the answer, "
            "whatever its words, and gets leak_penalty; every other one's shift is taken off its gain "
            "(answer_flow_credit). One responder prompt per new state and one per new request, cached (in "
            "baseline_cache's file when set). Turn it off only where the responder's no-memory answer means nothing "
            "(a random-init responder), and say why in the config."
        },
    )
    answer_flow_credit: bool = field(
        default=True,
        metadata={
            "help": "With answer_flow_check: reward = gain - no-memory shift, so a state is paid only for what it "
            "changes through the memories (no cliff below the threshold). False leaves the hard threshold alone."
        },
    )
    answer_flow_threshold: float = field(
        default=DEFAULT_THRESHOLD,
        metadata={
            "help": "Largest no-memory shift (the share of a candidate's headroom a state fills alone, over all "
            "candidates) a state may cause before it is rejected as a leak, in [0, 1). Calibrate it per responder "
            "(benchmarks/calibrate_answer_flow.py)."
        },
    )
    max_unscorable_share: float = field(
        default=0.5,
        metadata={
            "help": "Stop the run when more than this share of a generation round's completions that needed the "
            "responder (those past the format, leak and answer-flow gates) got no score (responder down, past "
            "responder_deadline, malformed replies), summed over all ranks, for unscorable_patience rounds in a row. "
            "It stops inside the reward, before that round's optimizer step, after saving a checkpoint of the last "
            "completed step and stopped.json; exit status 3; fix the responder and rerun with --resume. In [0, 1]; "
            "1 never stops (unscorable completions then get a zero advantage, as TRL does)."
        },
    )
    unscorable_patience: int = field(
        default=1,
        metadata={
            "help": "Consecutive generation rounds (reward calls) above max_unscorable_share before the run stops; "
            "the rounds before the last train on what was scored."
        },
    )
    baseline_cache: str | None = field(
        default=None,
        metadata={"help": "SQLite file of no-state baselines, shared by runs (fill it with precompute-baselines)."},
    )
    baseline_cache_access: Literal["auto", "read-only", "read-write"] = field(
        default="auto",
        metadata={
            "help": "How each process opens baseline_cache (and the answer-flow table in it). 'read-write': the file "
            "itself in SQLite's WAL mode, new baselines and answer-flow probabilities written back; WAL needs one "
            "host and a local filesystem, so this is refused on a network filesystem (NFS, Lustre, GPFS, CIFS, ...) "
            "and with processes on several nodes. 'read-only': the file, filled beforehand by precompute-baselines "
            "(finished: no -wal file next to it), is copied once per node to baseline_cache_local_dir and the copy "
            "read with no lock; new values stay in each process's memory and the shared file is never modified. "
            "'auto': read-write for a single process on a local filesystem, read-only otherwise."
        },
    )
    baseline_cache_local_dir: str | None = field(
        default=None,
        metadata={
            "help": "Node-local directory for baseline_cache's read-only copy (default: $SLURM_TMPDIR, else $TMPDIR, "
            "else /tmp, in a memstate-<uid> folder). A copy is named by a digest of the source's path, size and "
            "modification time and reused while the source is unchanged."
        },
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
    completions_per_step: int | None = field(
        default=None,
        metadata={
            "help": "Completions per optimizer step. When set, gradient_accumulation_steps is derived from it and the "
            "number of training processes (completions_per_step / (per_device_train_batch_size x processes)), so a "
            "step, the steps per generation round, warm-up and save intervals mean the same on any number of GPUs; "
            "leave gradient_accumulation_steps unset then. A count that does not divide is refused at start, with "
            "the valid process counts (train/launch.py)."
        },
    )
    stop_file: str | None = field(
        default=None,
        metadata={
            "help": "A path whose appearance makes the run save a checkpoint and stop after the current optimizer "
            "step (checked every step, decided on rank 0 for all ranks); the SLURM script creates it on the "
            "pre-time-limit signal so the job ends with a checkpoint to --resume from."
        },
    )
    log_completions_max_rows: int = field(
        default=64,
        metadata={
            "help": "With log_completions, the completions table printed and sent to wandb each logging step keeps "
            "only the last this-many completions (whole groups when a multiple of num_generations); TRL would keep a "
            "whole generation round (4,096 rows of 8k-token prompts in production). Every completion's gate and "
            "scores are in OUTPUT_DIR/audit either way."
        },
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
            "whole groups. Falls back to TRL's path, logged, for sliding-window models, multimodal inputs, the MoE "
            "load-balancing loss, Liger kernels, and, with the dense mask, attention kernels that take no 4-D mask "
            "(flash_attention_*); docs/shared_prefix.md."
        },
    )
    shared_prefix_attention: Literal["auto", "dense", "flex", "split"] = field(
        default="auto",
        metadata={
            "help": "How shared-prefix training gives attention its pattern (train/packing.py): 'dense', an (L x L) "
            "boolean mask per packed row for the model's sdpa / eager kernel; 'flex', a FlexAttention BlockMask "
            "that skips the masked blocks and costs kilobytes (compiled on first use; torch has no flex backward on "
            "CPU, where the gradient pass is split); 'split', no row mask: the prompt attends causally to itself and "
            "the group's completions, as a batch, to the prompt and themselves, in stock SDPA calls; 'auto', flex on "
            "CUDA, split elsewhere. flex and split need the model loaded with sdpa (or flash); if either fails the "
            "first-use check or does not compile, the run continues with the dense mask, logged."
        },
    )
    shared_prefix_check: Literal["off", "logps", "gradients"] = field(
        default="logps",
        metadata={
            "help": "First-use self-check of the shared-prefix path against TRL's on the live batch: per-token "
            "log-probs ('logps'), also parameter gradients ('gradients'; under DeepSpeed ZeRO-1/2, not ZeRO-3), or "
            "none ('off'). A "
            "mismatch turns the path off for the run, logged."
        },
    )
    shared_prefix_on_failure: Literal["fallback", "fail"] = field(
        default="fallback",
        metadata={
            "help": "When the shared-prefix path cannot run (the model's attention takes no 4-D mask, or the first-use "
            "check fails): 'fallback' continues on TRL's per-completion path, logged as an error; 'fail' stops with "
            "the fix. TRL's path needs G x (P + R) tokens per group instead of P + G x R: at production lengths a "
            "micro-batch sized for the shared path may not fit, so production configs fail instead of running "
            "out of memory hours later."
        },
    )
    shared_prefix_check_tolerance: float | None = field(
        default=None,
        metadata={
            "help": "Largest mean |log-prob difference| the check accepts (default: 1e-4 in fp32, 1e-1 in bf16, "
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
        if self.completions_per_step is not None and self.completions_per_step < 1:
            raise ConfigError(f"completions_per_step must be at least 1, got {self.completions_per_step}")
        if self.log_completions_max_rows < 1:
            raise ConfigError(f"log_completions_max_rows must be at least 1, got {self.log_completions_max_rows}")
        if not 0.0 <= self.answer_flow_threshold < 1.0:
            raise ConfigError(f"answer_flow_threshold must be in [0, 1), got {self.answer_flow_threshold}")
        if not 0.0 <= self.max_unscorable_share <= 1.0:
            raise ConfigError(f"max_unscorable_share must be in [0, 1], got {self.max_unscorable_share}")
        if self.unscorable_patience < 1:
            raise ConfigError(f"unscorable_patience must be at least 1, got {self.unscorable_patience}")
        if self.max_validation_instances is not None and self.max_validation_instances < 1:
            raise ConfigError(f"max_validation_instances must be at least 1, got {self.max_validation_instances}")


def load_train_instances(script_args: MemstateTrainArguments) -> list:
    """The training split (first ``max_train_instances``); a data_dir without it is a ``ConfigError``."""
    try:
        instances = load_split(script_args.data_dir, script_args.train_split)
    except FileNotFoundError as e:
        raise ConfigError(f"data_dir: {e}") from None
    return instances[: script_args.max_train_instances] if script_args.max_train_instances else instances


def hub_offline() -> bool:
    """Whether the Hub is off for this process: ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` as the environment says
    now, or as huggingface_hub read it at import (it reads it once). Checks that only look for a model pass
    ``local_files_only=hub_offline()``: an air-gapped node must not wait on the Hub's connection retries (~45 s) to
    learn what its cache holds."""
    from huggingface_hub import constants

    said = [os.environ.get(name, "").strip().upper() for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")]
    return bool(constants.HF_HUB_OFFLINE) or any(v in {"1", "ON", "YES", "TRUE"} for v in said)


def policy_positions(policy_model: str) -> int | None:
    """The policy's ``max_position_embeddings`` from its config (a local dir, or a Hub id already cached); None where
    the config cannot be read here (a Hub id on a machine without it: the cluster's own run checks again)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(policy_model, local_files_only=hub_offline())
    except (OSError, ValueError):
        return None
    return getattr(config.get_text_config(), "max_position_embeddings", None)


def check_context(script_args: MemstateTrainArguments, config: GRPOConfig) -> None:
    """Refuse a prompt + completion budget longer than the policy's positions, before anything loads: past them the
    rotary positions were never trained (or the model refuses), and ``serve policy`` could not serve the budget."""
    positions = policy_positions(script_args.policy_model)
    budget = script_args.max_prompt_tokens + config.max_completion_length
    if positions is not None and budget > positions:
        raise ConfigError(
            f"max_prompt_tokens {script_args.max_prompt_tokens} + max_completion_length {config.max_completion_length} "
            f"= {budget} exceeds the policy's {positions} positions ({script_args.policy_model}: "
            f"max_position_embeddings); set max_prompt_tokens to at most {positions - config.max_completion_length}"
        )


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


def check_model_init(script_args: MemstateTrainArguments, config: GRPOConfig) -> None:
    """Refuse an attention implementation the shared-prefix path cannot use when it must not fall back.

    A user who sets ``flash_attention_2`` (common on H100s) with the dense mask would silently turn the path off, and
    TRL's path needs several times the activation memory at production lengths. The flex path ('auto' on CUDA) runs
    flex attention in the packed forward whatever the model was loaded with.
    """
    from memstate.train.shared_prefix import MASKED_ATTENTION

    kwargs = config.model_init_kwargs if isinstance(config.model_init_kwargs, dict) else {}
    implementation = kwargs.get("attn_implementation")
    if (
        script_args.shared_prefix_training
        and script_args.shared_prefix_on_failure == "fail"
        and script_args.shared_prefix_attention == "dense"
        and implementation is not None
        and implementation not in MASKED_ATTENTION
    ):
        raise ConfigError(
            f"model_init_kwargs.attn_implementation {implementation!r} takes no 4-D mask, so shared-prefix training "
            f"cannot run: use one of {list(MASKED_ATTENTION)}, or shared_prefix_training: false with a smaller "
            "per_device_train_batch_size"
        )


def check_responder(responder: ResponderConfig) -> None:
    """The responder settings training needs, before anything loads: a responder, and a registered score mode
    (``ConfigError`` naming the registered ones otherwise)."""
    if not responder.responder_model:
        raise ConfigError("responder_model is required (the frozen responder that measures the answer gain)")
    score_mode(responder.score_mode)


def check_validation_settings(config: GRPOConfig) -> None:
    """Refuse saves that validation would not score: ``best/`` is chosen by the validation gain measured at a
    checkpoint's step, so with both strategies 'steps' every save must fall on an evaluation (as transformers asks
    of ``load_best_model_at_end``)."""
    from memstate.train.best import save_interval

    if config.eval_strategy != "steps" or config.save_strategy != "steps":
        return
    every = save_interval(config)
    evaluate_every = save_interval(SimpleNamespace(save_steps=config.eval_steps, max_steps=config.max_steps))
    if every % evaluate_every:
        raise ConfigError(
            f"save_steps {config.save_steps} is not a multiple of eval_steps {config.eval_steps}: a checkpoint "
            f"between evaluations would have no validation gain to be chosen by; set eval_steps to a divisor of "
            f"{every} (e.g. {every}), or eval_strategy: no to choose best/ by training reward"
        )


class TrainParser(StageParser):
    """``--dry-run`` and ``--precompute-baselines`` relax only device and precision, so a GPU config runs them on a
    host without a free GPU (neither uses them: the arithmetic, and a served responder's baselines)."""

    def parse_args_and_config(self, args: list[str] | None = None, **kwargs) -> tuple:  # type: ignore[override]
        args = list(args or [])
        if {"--dry-run", "--dry_run", "--precompute-baselines", "--precompute_baselines"} & set(args):
            args += ["--use_cpu", "true", "--bf16", "false"]
        return super().parse_args_and_config(args, **kwargs)


def make_parser(prog: str | None = None) -> TrainParser:
    parser = TrainParser(
        (MemstateTrainArguments, ResponderConfig, GRPOConfig),
        prog=prog,
        description="GRPO-train the policy. --config FILE.yaml (flat keys: the fields below), then any field as "
        "--field value to override the file, e.g. --config configs/train/tiny_cpu.yaml --max_steps 2.",
    )
    parser.add_argument(
        "--resume",
        nargs="?",
        const="last",
        choices=["last", "auto"],
        help="Continue from the newest complete checkpoint in output_dir (an incomplete save is set aside); "
        "'--resume auto' (the launch scripts' default): continue if there is one, else start fresh. Without it a "
        "run refuses an output_dir that holds checkpoints.",
    )
    parser.add_argument(
        "--dry-run",
        "--dry_run",
        action="store_true",
        help="Validate config, data and tokenizer without loading weights; print the batch arithmetic.",
    )
    parser.add_argument(
        "--world-size", "--world_size", type=int, help="Processes the dry run assumes (default: $WORLD_SIZE or 1)."
    )
    parser.add_argument(
        "--precompute-baselines",
        "--precompute_baselines",
        action="store_true",
        help="Only fill baseline_cache with the baselines this run will need (train split, and validation split when "
        "validating), node-local then renamed onto its path; the launch scripts run it once the responder is up.",
    )
    parser.add_argument(
        "--launch-checks",
        "--launch_checks",
        action="store_true",
        help="With --dry-run, on the job's own node (the launch scripts): refuse, instead of reporting, a model that "
        "does not resolve with HF_HUB_OFFLINE set, and a disk that cannot hold the kept saves.",
    )
    return parser


def parse_train_args(argv: list[str] | None = None) -> tuple[MemstateTrainArguments, ResponderConfig, GRPOConfig]:
    """``--config FILE.yaml`` plus ``--field value`` overrides, as every TRL script reads them."""
    script_args, responder, grpo_config, *_ = make_parser().parse_args_and_config(argv)
    return script_args, responder, grpo_config
