"""The ``memstate train`` command: checks that need no weights, the launch arithmetic for this world size, then the
dry-run report or the training run (``train/run.py``)."""

from __future__ import annotations

import argparse
import os

from memstate.responders import ResponderConfig
from memstate.train.config import (
    GRPOConfig,
    MemstateTrainArguments,
    check_context,
    check_model_init,
    check_responder,
    check_validation_settings,
    check_vllm_settings,
    make_parser,
)
from memstate.train.launch import fit_to_world

__all__ = ["make_parser", "run"]  # the command's parser and runner (memstate/cli.py: COMMANDS)


def run(parsed: tuple[MemstateTrainArguments, ResponderConfig, GRPOConfig, argparse.Namespace]) -> None:
    script_args, responder, grpo_config, options = parsed
    check_responder(responder)
    # A dry run (or a precompute) forces use_cpu (TrainParser) to run a GPU config anywhere: device settings unchecked.
    relaxed = options.dry_run or options.precompute_baselines  # use_cpu forced, not asked for (TrainParser)
    check_vllm_settings(script_args, grpo_config, on_cpu=grpo_config.use_cpu and not relaxed)
    check_model_init(script_args, grpo_config)
    check_context(script_args, grpo_config)
    check_validation_settings(grpo_config)
    # The batch settings for the processes of this launch (a dry run: the ones it is told), before anything loads.
    world_size = (options.world_size or int(os.environ.get("WORLD_SIZE", 1))) if options.dry_run else None
    grpo_config = fit_to_world(script_args.completions_per_step, grpo_config, world_size or grpo_config.world_size)
    if options.precompute_baselines:
        return precompute_for_training(script_args, responder, grpo_config)
    if options.dry_run:
        from memstate.train.dry_run import dry_run, resume_plan

        resume = resume_plan(grpo_config, options.resume, world_size)
        report = dry_run(script_args, grpo_config, world_size, responder, launch_checks=options.launch_checks)
        report["resume"] = resume
        width = max(map(len, report))
        for key, value in report.items():
            print(f"{key:<{width}}  {value}")
        return
    from memstate.train.run import train

    final = train(script_args, responder, grpo_config, resume=options.resume)
    print(f"final model: {final}")


def precompute_for_training(
    script_args: MemstateTrainArguments, responder_config: ResponderConfig, grpo_config: GRPOConfig
) -> None:
    """``--precompute-baselines``: fill ``baseline_cache`` with the baselines this run will ask for (its train split,
    and its validation split when it validates), from the same arguments as the run, in one process: node-local,
    then renamed onto the shared path (``reward.precompute.fill_shared_cache``). The launch scripts run it once the
    responder is healthy, before training."""
    import json

    from memstate.data import split_path
    from memstate.responders import make_responder
    from memstate.reward.precompute import fill_shared_cache
    from memstate.reward.responder_score import score_mode

    if not script_args.baseline_cache:
        print("baseline_cache is not set: every rank scores its baselines in training, nothing to precompute")
        return
    splits = [script_args.train_split]
    validation = script_args.validation_split
    if grpo_config.eval_strategy != "no" and split_path(script_args.data_dir, validation).is_file():
        splits.append(validation)
    likelihood = score_mode(responder_config.score_mode).likelihood
    responder = make_responder(responder_config, device="cpu" if grpo_config.use_cpu else "cuda", likelihood=likelihood)
    counts = fill_shared_cache(responder, script_args.data_dir, splits, script_args.baseline_cache,
                               responder_config.score_mode, script_args.baseline_cache_local_dir)  # fmt: skip
    print(json.dumps({"baseline_cache": str(script_args.baseline_cache), "splits": splits, **counts}))
    if counts["unscorable"]:
        raise SystemExit(f"{counts['unscorable']} baselines could not be scored (responder errors); rerun to retry")
