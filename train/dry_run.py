"""``memstate train --dry-run``: validate config, data and tokenizer without loading weights; print the batch
arithmetic a launch will follow. Runs on CPU for the production configs."""

from __future__ import annotations

import contextlib
import math
import shutil
import sqlite3
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer
from trl import GRPOConfig

from memstate.errors import ConfigError
from memstate.prompts import prompt_tokens
from memstate.responders import ResponderConfig
from memstate.train.config import MemstateTrainArguments, hub_offline, load_train_instances
from memstate.train.validation import validation_instances


def batch_arithmetic(config: GRPOConfig, n_instances: int, world_size: int) -> dict[str, int]:
    """How prompts, completions and optimizer steps relate for ``world_size`` processes (TRL 1.16 semantics:
    a generation round produces ``generation_batch_size`` completions, consumed in micro-batches of
    ``per_device_train_batch_size`` per process; ``gradient_accumulation_steps`` micro-batches make an optimizer
    step, and each round is optimized ``num_iterations`` times).

    >>> c = GRPOConfig(output_dir="x", use_cpu=True, per_device_train_batch_size=16, gradient_accumulation_steps=8,
    ...                num_generations=8, generation_batch_size=4096, bf16=False)
    >>> a = batch_arithmetic(c, n_instances=48000, world_size=8)
    >>> a["prompts_per_generation"], a["completions_per_optimizer_step"], a["optimizer_steps_per_generation"]
    (512, 1024, 4)
    """
    per_micro = config.per_device_train_batch_size * world_size
    generation = config.generation_batch_size or per_micro * (config.steps_per_generation or 1)
    if generation % config.num_generations or generation % per_micro:
        raise ConfigError(
            f"generation_batch_size {generation} must divide by num_generations {config.num_generations} and by "
            f"per_device_train_batch_size x world size = {per_micro}"
        )
    micro_steps_per_generation = generation // per_micro
    if micro_steps_per_generation % config.gradient_accumulation_steps:
        raise ConfigError(
            f"{micro_steps_per_generation} micro-batches per generation round do not divide into "
            f"gradient_accumulation_steps={config.gradient_accumulation_steps}"
        )
    per_step = per_micro * config.gradient_accumulation_steps
    steps_per_generation = micro_steps_per_generation // config.gradient_accumulation_steps * config.num_iterations
    rounds_per_epoch = math.ceil(n_instances * config.num_generations / generation)
    epochs = config.num_train_epochs
    steps = config.max_steps if config.max_steps > 0 else math.ceil(rounds_per_epoch * epochs) * steps_per_generation
    return {
        "world_size": world_size,
        "train_instances": n_instances,
        "num_generations": config.num_generations,
        "prompts_per_generation": generation // config.num_generations,
        "completions_per_generation": generation,
        "completions_per_micro_batch": per_micro,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "completions_per_optimizer_step": per_step,
        "optimizer_steps_per_generation": steps_per_generation,
        "generation_rounds_per_epoch": rounds_per_epoch,
        "optimizer_steps_per_epoch": rounds_per_epoch * steps_per_generation,
        "total_optimizer_steps": steps,
        "total_rollouts": steps // steps_per_generation * generation,
    }


def validation_plan(script_args: MemstateTrainArguments, config: GRPOConfig) -> dict:
    """What each evaluation of the validation split costs in responder prompts (``train/validation.py``): one per
    state (two with the answer-flow check), plus one baseline per instance the first time (then cached)."""
    if config.eval_strategy == "no":
        return {"validation": "off: best/ by training reward"}
    held_out = validation_instances(
        script_args.data_dir,
        script_args.validation_split,
        script_args.max_validation_instances,
        script_args.validation_seed if script_args.validation_seed is not None else config.seed,
    )
    if not held_out:
        return {"validation": f"off: no {script_args.validation_split!r} split; best/ by training reward"}
    states = len(held_out) * (config.num_generations_eval or config.num_generations)
    prompts = states * (2 if script_args.answer_flow_check else 1)
    return {
        "validation": f"{len(held_out)} {script_args.validation_split} instances x "
        f"{config.num_generations_eval or config.num_generations} states every {config.eval_steps} steps; "
        f"best/ by validation gain",
        "validation_responder_prompts": f"{prompts} per evaluation (+ {len(held_out)} baselines the first time)",
    }


def hub_files_unavailable(policy_model: str) -> str | None:
    """Why the tokenizer and config of a Hub policy cannot be read here (offline and not in the local cache), or None.

    A local path is always read (a typo there is an error); a Hub id on a machine without the Hub — a login node, CI —
    leaves the token counts and the KV-cache figures unchecked instead of failing the whole dry run.
    """
    if Path(policy_model).exists():
        return None
    if policy_model.startswith(("/", ".", "~")) or policy_model.count("/") != 1:  # a path, not an org/name Hub id
        raise ConfigError(f"policy_model: {policy_model}: no such directory")
    try:
        AutoConfig.from_pretrained(policy_model, local_files_only=hub_offline())
        AutoTokenizer.from_pretrained(policy_model, local_files_only=hub_offline())
    except OSError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"{policy_model} is neither a local directory nor reachable on the Hub from here ({first})"
    return None


def baseline_cache_status(
    script_args: MemstateTrainArguments, responder: ResponderConfig, instances: list
) -> tuple[str, int | None]:
    """Whether ``baseline_cache`` exists, and how many of ``instances`` (the train split, and the validation split
    when validating) it lacks a baseline for, in this score mode and from this responder (by instance id and
    responder name: training matches the exact request when it reads it). ``None``: no cache is configured.

    >>> from types import SimpleNamespace
    >>> baseline_cache_status(SimpleNamespace(baseline_cache=None), ResponderConfig(), [])
    ('none (baselines scored in training, kept in memory)', None)
    """
    if not script_args.baseline_cache:
        return "none (baselines scored in training, kept in memory)", None
    path = Path(script_args.baseline_cache).expanduser()
    if not path.is_file():
        text = (f"{path}: missing; the launch scripts fill it once the responder is up (memstate train ... "
                "--precompute-baselines); a run of several processes refuses to start without it")  # fmt: skip
        return text, len(instances)
    unfinished = [s for s in ("-wal", "-journal") if path.with_name(path.name + s).exists()]
    name, mode = responder.responder_model or "", responder.score_mode
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            query = ("SELECT instance_id FROM baseline_scores WHERE mode = ? AND (responder = ? OR "
                     "substr(responder, 1, ?) = ?)")  # fmt: skip
            rows = db.execute(query, (mode, name, len(name) + 1, f"{name}|")).fetchall()
    except sqlite3.Error as e:
        return f"{path}: not a readable baseline cache ({e})", len(instances)
    held = {r for (r,) in rows}
    have = sum(inst.id in held for inst in instances)
    note = f"; {' and '.join(unfinished)} next to it: unfinished, training refuses it" if unfinished else ""
    return (f"{path}: {have} of {len(instances)} instances have a {mode} baseline from {name or 'this responder'}"
            f"{note}"), len(instances) - have  # fmt: skip


def models_local(script_args: MemstateTrainArguments, responder_model: str | None) -> str:
    """With the Hub off: whether the policy (config, tokenizer, weights) and the responder resolve from local files
    (a directory, or ``HF_HOME``'s cache), as the nodes will need them. Starts with ``ok`` or ``MISSING``."""
    from huggingface_hub import constants, snapshot_download

    problems, found = [], []
    for role, name in (("policy", script_args.policy_model), ("responder", responder_model)):
        if not name:
            continue
        path = Path(name).expanduser()
        if not path.exists():
            try:
                path = Path(snapshot_download(name, local_files_only=True))
            except Exception:  # not cached (LocalEntryNotFoundError), or not a Hub id at all
                problems.append(f"{role} {name} is not in {constants.HF_HUB_CACHE} (huggingface-cli download {name} "
                                "where the Hub is reachable)")  # fmt: skip
                continue
        lacking = [what for what, patterns in (("config.json", ["config.json"]),
                                               ("a tokenizer", ["tokenizer.json", "tokenizer_config.json"]),
                                               ("weights", ["*.safetensors", "*.bin"]))
                   if not any(any(path.glob(p)) for p in patterns)]  # fmt: skip
        if lacking:
            where = "" if str(path) == name else f" ({path})"
            problems.append(f"{role} {name}{where} lacks {', '.join(lacking)}")
        else:
            found.append(f"{role} {name}")
    if problems:
        return "MISSING: " + "; ".join(problems)
    return f"ok: {', '.join(found)} resolve without the Hub"


# A save holds per trained parameter: the weights twice (the consolidated model.safetensors and DeepSpeed's
# partitions; 2 bytes each in bf16) and the optimizer's fp32 master weights and Adam's two moments (12 bytes): ~16
# bytes, ~64 GB for a 4B policy.
OPTIMIZER_BYTES_PER_TRAINED_PARAMETER = 12


def checkpoint_disk(script_args: MemstateTrainArguments, config: GRPOConfig, output_dir: str) -> dict:
    """The size of one checkpoint and the disk the kept saves need (``save_total_limit`` checkpoints + final/ +
    best/ + format-warmup/), from the policy's parameter count (its config on the meta device: no weights), and
    the space free where ``output_dir`` goes. LoRA: the adapters and their optimizer state per checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM

    model_config = AutoConfig.from_pretrained(script_args.policy_model, local_files_only=hub_offline())
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config)
    params = sum(p.numel() for p in model.parameters())
    # Saved in the dtype the model ships in (a dry run forces bf16 off, so the config cannot say it).
    weight_bytes = 4 if str(getattr(model_config, "dtype", None) or "").endswith("float32") else 2
    model_bytes = params * weight_bytes
    per_parameter = OPTIMIZER_BYTES_PER_TRAINED_PARAMETER + 2 * weight_bytes
    # LoRA: adapters of rank <= 64 on a model's projections are ~1% of its weights at most.
    per_save = params * (0.01 if script_args.use_peft else 1) * per_parameter
    kept = config.save_total_limit if config.save_strategy != "no" and config.save_total_limit else None
    whole_models = 2 + (script_args.format_warmup_steps > 0)  # final/, best/, format-warmup/
    needed = (kept or 1) * per_save + whole_models * model_bytes
    where = Path(output_dir).expanduser().absolute()
    while not where.exists():
        where = where.parent
    free = shutil.disk_usage(where).free
    report = {
        "policy_parameters": f"{params:,}",
        "checkpoint_size_per_save": f"{_size(per_save)} ({per_parameter} bytes a trained parameter: its weight "
        "twice, fp32 master weight and Adam's two moments)"
        + (" for LoRA adapters of at most 1% of the weights" if script_args.use_peft else ""),
        "disk_for_kept_saves": f"{_size(needed)} ({kept if kept else 'every'} checkpoint(s)"
        f"{'' if kept else ': save_total_limit is unset, this counts one'} + {whole_models} whole models of "
        f"{_size(model_bytes)}); free at {where}: {_size(free)}",
    }
    if free < needed:
        report["disk_for_kept_saves"] += " — NOT ENOUGH"
    return report | {"_disk_short": free < needed}


def resume_plan(config: GRPOConfig, resume: str | None, world_size: int) -> str:
    """What the run would continue from (``train/resume.py``; nothing is set aside here), refusing what training
    would refuse: a fresh start over checkpoints, ``--resume`` with none complete, another world size than the one a
    DeepSpeed checkpoint was saved by (the stage is the launch's, unknown here: the run checks it)."""
    from memstate.checkpoint import CheckpointMetadata
    from memstate.train.resume import check_resume_shape, resume_checkpoint

    if resume is None and config.resume_from_checkpoint:
        return f"from {config.resume_from_checkpoint} (resume_from_checkpoint)"
    checkpoint = resume_checkpoint(config.output_dir, resume, main_process=False)
    if checkpoint is None:
        return "fresh start" + (" (--resume auto: no complete checkpoint)" if resume else "")
    metadata = CheckpointMetadata.read(checkpoint)
    saved_stage = metadata.zero_stage if metadata else None
    check_resume_shape(checkpoint, world_size, saved_stage)
    shape = "" if metadata is None or metadata.world_size is None else f", saved by {metadata.world_size} processes"
    return f"from {checkpoint}{shape}"


# What a trainer asked to stop may still do before its checkpoint is on disk, beyond the reward round: finish the
# step's generation and optimizer step, and write the save (~64 GB for the 4B policy under ZeRO-3).
STEP_AND_SAVE_ALLOWANCE_S = 900
RESPONDER_PASSES = 4  # fitting, answer flow, baselines, scoring: each may wait up to responder_deadline


def stop_grace_s(responder: ResponderConfig) -> int:
    """How long the launch scripts' watcher waits for a trainer it asked to stop before killing it: the longest a
    reward round may wait on the responder (``responder_round_deadline``, else ``responder_deadline`` per pass),
    plus ``STEP_AND_SAVE_ALLOWANCE_S``. SLURM's pre-time-limit signal must come at least this early.

    >>> stop_grace_s(ResponderConfig(responder_deadline=900.0, responder_round_deadline=900.0))
    1800
    >>> stop_grace_s(ResponderConfig(responder_deadline=900.0))
    4500
    """
    round_s = responder.responder_round_deadline or (responder.responder_deadline or 0) * RESPONDER_PASSES
    return int(round_s + STEP_AND_SAVE_ALLOWANCE_S)


def _size(n: float) -> str:
    """
    >>> _size(64.3e9), _size(2.5e6)
    ('64.3 GB', '2.5 MB')
    """
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def dry_run(
    script_args: MemstateTrainArguments,
    config: GRPOConfig,
    world_size: int,
    responder: ResponderConfig | None = None,
    *,
    launch_checks: bool = False,
) -> dict:
    """Load the data and the tokenizer (no weights), measure prompt lengths, and return the arithmetic.
    ``launch_checks`` (the launch scripts, on the job's own node): a model that does not resolve with the Hub off,
    or a disk that cannot hold the kept saves, is a ``ConfigError``."""
    instances = load_train_instances(script_args)
    if not instances:
        raise ConfigError(f"{script_args.data_dir}: split {script_args.train_split!r} is empty")
    report = batch_arithmetic(config, len(instances), world_size)
    report |= validation_plan(script_args, config)
    report |= {
        "max_prompt_tokens": script_args.max_prompt_tokens,
        "max_completion_length": config.max_completion_length,
    }
    responder = responder or ResponderConfig()
    scored = instances
    if config.eval_strategy != "no":
        scored = [
            *instances,
            *(validation_instances(script_args.data_dir, script_args.validation_split, None, 0) or []),
        ]
    report["baseline_cache"], missing = baseline_cache_status(script_args, responder, scored)
    report["baseline_cache_missing"] = "-" if missing is None else missing
    report["stop_grace_s"] = stop_grace_s(responder)
    # Whether the nodes could load the models with the Hub off (the launch scripts' default), wherever this runs.
    report["models_local"] = models_local(script_args, responder.responder_model)
    if not hub_offline():
        report["models_local"] += " (HF_HUB_OFFLINE is not set here: a missing model would be downloaded)"
    elif launch_checks and report["models_local"].startswith("MISSING"):
        raise ConfigError(f"HF_HUB_OFFLINE is set and {report['models_local'][len('MISSING: ') :]}")
    unavailable = hub_files_unavailable(script_args.policy_model)
    if unavailable:
        unchecked = "prompt token counts, chat template, shared-prefix saving, KV cache per token, checkpoint size"
        report |= {"not_checked": f"{unchecked}: {unavailable}; run where the Hub (or its cache) is reachable"}
        return report | ({"vllm": config.vllm_mode} if config.use_vllm else {"vllm": "off (transformers generate)"})
    disk = checkpoint_disk(script_args, config, config.output_dir)
    if launch_checks and disk["_disk_short"]:
        raise ConfigError(f"output_dir {config.output_dir}: {disk['disk_for_kept_saves']}; free space, lower "
                          "save_total_limit or set output_dir elsewhere")  # fmt: skip
    report |= {k: v for k, v in disk.items() if not k.startswith("_")}
    tokenizer = AutoTokenizer.from_pretrained(script_args.policy_model)
    if tokenizer.chat_template is None:
        raise ConfigError(f"{script_args.policy_model}: the tokenizer has no chat template")
    lengths = sorted(prompt_tokens(tokenizer, inst) for inst in instances)
    report |= {
        "prompt_tokens_max": lengths[-1],
        "prompt_tokens_p50": lengths[len(lengths) // 2],
        "prompts_over_budget": sum(n > script_args.max_prompt_tokens for n in lengths),
    }
    report |= shared_prefix_saving(script_args, config, lengths)
    return report | vllm_settings(script_args.policy_model, config)


def shared_prefix_saving(script_args: MemstateTrainArguments, config: GRPOConfig, lengths: list[int]) -> dict:
    """Policy-side tokens per micro-batch (training forward/backward, and again for old-policy and reference
    log-probs), TRL's path vs the shared-prefix path, at the data's median prompt and full-length completions.

    Micro-batches hold whole groups under the shared path, so a micro-batch of ``b`` completions spans ``ceil(b / G)``
    prompts (one, when ``b`` <= G).

    >>> args = type("A", (), {"shared_prefix_training": True, "max_prompt_tokens": 8192,
    ...                       "shared_prefix_on_failure": "fail", "shared_prefix_attention": "auto"})()
    >>> c = type("C", (), {"per_device_train_batch_size": 16, "num_generations": 8, "max_completion_length": 150})()
    >>> r = shared_prefix_saving(args, c, [1800, 2000, 2200])
    >>> r["training_tokens_per_micro_batch"], r["shared_prefix_tokens_ratio"]
    ('stock 34400, shared 6400', 5.38)
    >>> r["shared_prefix_attention"]
    'auto (flex on CUDA, split on CPU): dense 19.5 MiB, split 0.6 MiB, flex block mask 20 KiB'
    """
    per_device, group = config.per_device_train_batch_size, config.num_generations
    prompt, completion = min(lengths[len(lengths) // 2], script_args.max_prompt_tokens), config.max_completion_length
    stock = per_device * (prompt + completion)
    shared = math.ceil(per_device / group) * prompt + per_device * completion
    if not script_args.shared_prefix_training:
        return {"shared_prefix_training": "off", "training_tokens_per_micro_batch": f"stock {stock}"}
    rows, completions = math.ceil(per_device / group), min(per_device, group)
    return {
        "shared_prefix_training": "on; if the first-use check fails or the model takes no 4-D mask: "
        + ("stop with the fix" if script_args.shared_prefix_on_failure == "fail" else "TRL's path, logged"),
        "training_tokens_per_micro_batch": f"stock {stock}, shared {shared}",
        "shared_prefix_tokens_ratio": round(stock / shared, 2),
        "shared_prefix_attention": ATTENTION_PATHS[script_args.shared_prefix_attention]
        + ": "
        + mask_memory(rows, prompt, completions, completion),
    }


ATTENTION_PATHS = {
    "auto": "auto (flex on CUDA, split on CPU)",
    "flex": "flex (on CPU split for the gradient pass)",
    "split": "split",
    "dense": "dense",
}


def mask_memory(rows: int, prompt: int, completions: int, completion: int) -> str:
    """What each attention path hands the layers as their mask per micro-batch of ``rows`` packed rows, each a
    ``prompt`` and ``completions`` completions of ``completion`` tokens: dense, one bool per (query, key); split,
    per row the completions' token indices (int64), their real slots and one (R x (P - 1 + R)) bool mask; a
    FlexAttention block mask, per 128 x 128 block a count and an index (int32) for partial and full blocks, by query
    and by key (the backward's).

    >>> mask_memory(2, 8192, 8, 512)
    'dense 288.0 MiB, split 8.6 MiB, flex block mask 291 KiB'
    """
    length = prompt + completions * completion
    blocks = math.ceil(length / 128)
    flex = rows * 4 * (blocks + blocks * blocks) * 4
    split = rows * (completions * completion * 9 + completion * (prompt - 1 + completion))
    return (
        f"dense {rows * length * length / 2**20:.1f} MiB, split {split / 2**20:.1f} MiB, "
        f"flex block mask {flex / 2**10:.0f} KiB"
    )


def vllm_settings(policy_model: str, config: GRPOConfig) -> dict:
    """What the rollout engine gets: mode, context length, memory share, sleep mode, and the KV cache one sequence
    at that context takes (bf16, from the policy's config: layers x KV heads x head size x K and V)."""
    if not config.use_vllm:
        return {"vllm": "off (transformers generate)"}
    model = AutoConfig.from_pretrained(policy_model)
    text = getattr(model, "text_config", model)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_bytes_per_token = 2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * 2
    report = {"vllm": config.vllm_mode}
    if config.vllm_mode == "colocate":
        report |= {
            "vllm_max_model_length": config.vllm_max_model_length,
            "vllm_gpu_memory_utilization": config.vllm_gpu_memory_utilization,
            "vllm_enable_sleep_mode": config.vllm_enable_sleep_mode,
            "vllm_tensor_parallel_size": config.vllm_tensor_parallel_size,
        }
    else:
        report["vllm_server"] = (
            config.vllm_server_base_url or f"http://{config.vllm_server_host}:{config.vllm_server_port}"
        )
    context = config.vllm_max_model_length or text.max_position_embeddings
    report |= {
        "policy_max_position_embeddings": text.max_position_embeddings,
        "kv_cache_kib_per_token": round(kv_bytes_per_token / 2**10, 1),
        "kv_cache_mib_per_sequence_at_context": round(kv_bytes_per_token * context / 2**20, 1),
    }
    return report
