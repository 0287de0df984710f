"""Launch arithmetic: the batch settings fitted to the number of training processes, checked before anything loads.

TRL checks its batch sizes when ``GRPOConfig`` is built, inside every rank, after the launcher has started; a
setting that does not divide fails there, on day one, after the responder has started and the weights have loaded.
``fit_to_world`` runs the same checks (TRL's own ``GRPOConfig.__post_init__``, for the given world size) plus
memstate's, in ``memstate train --dry-run --world-size N`` (the sbatch runs it before anything starts) and again at the
start of every real run, and names the nearest valid setting when one fails.

``completions_per_step`` fixes what an optimizer step is: ``gradient_accumulation_steps`` is derived from it and the
world size, so the same YAML means the same optimisation on 4, 8 or 32 GPUs (steps per round, warm-up and save
intervals included).
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import contextmanager
from unittest import mock

from trl import GRPOConfig

from memstate.errors import ConfigError

MAX_PROCESSES = 256  # how far the list of valid process counts looks


@contextmanager
def simulated_world_size(world_size: int):
    """``GRPOConfig.world_size`` reads the live process group; a dry run on one CPU process validates for another
    count by answering ``world_size`` for it while TRL builds the config."""
    with mock.patch.object(GRPOConfig, "world_size", new_callable=mock.PropertyMock, return_value=world_size):
        yield


def requested_generation_batch(config: GRPOConfig) -> int | None:
    """The generation batch the user asked for, or None when TRL derived it (one round per optimizer step).

    TRL fills ``generation_batch_size`` in ``__post_init__`` when neither it nor ``steps_per_generation`` is set;
    the value then tracks the world size it was built for, so it is recomputed for another one.
    """
    derived = config.per_device_train_batch_size * config.world_size * config.gradient_accumulation_steps
    if config.steps_per_generation == config.gradient_accumulation_steps and config.generation_batch_size == derived:
        return None
    return config.generation_batch_size


def valid_process_counts(per_device: int, per_step: int, generation: int, group: int, tp: int) -> list[int]:
    """Process counts for which one optimizer step of ``per_step`` completions and a round of ``generation`` divide
    into micro-batches of ``per_device`` per process.

    >>> valid_process_counts(16, 1024, 4096, 8, 1)
    [1, 2, 4, 8, 16, 32, 64]
    """
    return [
        w
        for w in range(1, MAX_PROCESSES + 1)
        if per_step % (per_device * w) == 0 and generation % (per_device * w) == 0 and w % tp == 0
    ]


def nearest_multiple(value: int, unit: int) -> int:
    """The multiple of ``unit`` closest to ``value`` (at least ``unit``; ties go up).

    >>> nearest_multiple(1024, 384), nearest_multiple(4096, 1152), nearest_multiple(10, 384)
    (1152, 4608, 384)
    """
    return max(unit, math.floor(value / unit + 0.5) * unit)


def _counts(counts: list[int]) -> str:
    return ", ".join(map(str, counts[:10])) + (", ..." if len(counts) > 10 else "")


def fit_to_world(completions_per_step: int | None, config: GRPOConfig, world_size: int) -> GRPOConfig:
    """``config`` with ``gradient_accumulation_steps`` derived for ``world_size`` processes (from
    ``completions_per_step`` when set), rebuilt by TRL for that world size; a ``ConfigError`` of one line naming a
    valid setting when TRL or memstate would refuse it.

    >>> c = GRPOConfig(output_dir="x", use_cpu=True, bf16=False, per_device_train_batch_size=16,
    ...                num_generations=8, generation_batch_size=4096)
    >>> fit_to_world(1024, c, 8).gradient_accumulation_steps, fit_to_world(1024, c, 4).gradient_accumulation_steps
    (8, 16)
    >>> try:
    ...     fit_to_world(1024, c, 24)
    ... except ConfigError as e:
    ...     print(str(e).replace(": ", ":\\n").replace(", or ", ",\\nor ").replace(" do not", "\\ndo not"))
    24 processes x per_device_train_batch_size 16 = 384 completions per micro-batch
    do not divide completions_per_step 1024:
    use 1, 2, 4, 8, 16, 32, 64 processes,
    or set completions_per_step 1152 and generation_batch_size 4608 for 24 processes
    """
    if world_size < 1:
        raise ConfigError(f"world size must be at least 1, got {world_size}")
    per_device, group = config.per_device_train_batch_size, config.num_generations
    tp = config.vllm_tensor_parallel_size if config.use_vllm and config.vllm_mode == "colocate" else 1
    micro = per_device * world_size
    if group < 2:
        raise ConfigError(f"num_generations must be at least 2 (GRPO compares a prompt's completions), got {group}")
    if completions_per_step is not None:
        if config.gradient_accumulation_steps not in (1, completions_per_step // micro):
            raise ConfigError(
                f"completions_per_step {completions_per_step} and gradient_accumulation_steps "
                f"{config.gradient_accumulation_steps} both set: completions_per_step derives the accumulation from "
                "the world size; leave gradient_accumulation_steps unset"
            )
        per_step = completions_per_step
    else:
        per_step = micro * config.gradient_accumulation_steps
    generation = requested_generation_batch(config) or per_step

    def refuse(problem: str) -> ConfigError:
        counts = valid_process_counts(per_device, per_step, generation, group, tp)
        step = nearest_multiple(per_step, micro)
        round_ = nearest_multiple(generation, math.lcm(step, group))
        setting = "completions_per_step" if completions_per_step is not None else "gradient_accumulation_steps"
        fix = f"{setting} {step if completions_per_step is not None else step // micro}"
        fix += f" and generation_batch_size {round_}" if round_ != generation else ""
        use = f"use {_counts(counts)} processes, or " if counts else ""
        return ConfigError(f"{problem}: {use}set {fix} for {world_size} processes")

    if per_step % micro:
        name = "completions_per_step" if completions_per_step is not None else "the step"
        raise refuse(
            f"{world_size} processes x per_device_train_batch_size {per_device} = {micro} completions per "
            f"micro-batch do not divide {name} {per_step}"
        )
    if generation % group:
        raise refuse(f"generation_batch_size {generation} does not divide by num_generations {group}")
    if generation % micro:
        raise refuse(
            f"generation_batch_size {generation} must divide by per_device_train_batch_size x world size = {micro}"
        )
    if generation % per_step:
        raise refuse(
            f"generation_batch_size {generation} is not a whole number of optimizer steps of {per_step} completions"
        )
    if world_size % tp:
        raise ConfigError(f"vllm_tensor_parallel_size {tp} must divide the {world_size} processes")
    try:
        with simulated_world_size(world_size):  # TRL's own checks, for this many processes
            return dataclasses.replace(
                config,
                gradient_accumulation_steps=per_step // micro,
                generation_batch_size=generation,
                steps_per_generation=None,
            )
    except ValueError as e:
        raise ConfigError(f"TRL's GRPOConfig refuses these settings for {world_size} processes: {e}") from None
