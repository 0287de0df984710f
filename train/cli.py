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
    # A dry run forces use_cpu (TrainParser) to validate a GPU config anywhere: its device settings are not checked.
    check_vllm_settings(script_args, grpo_config, on_cpu=grpo_config.use_cpu and not options.dry_run)
    check_model_init(script_args, grpo_config)
    check_context(script_args, grpo_config)
    check_validation_settings(grpo_config)
    # The batch settings for the processes of this launch (a dry run: the ones it is told), before anything loads.
    world_size = (options.world_size or int(os.environ.get("WORLD_SIZE", 1))) if options.dry_run else None
    grpo_config = fit_to_world(script_args.completions_per_step, grpo_config, world_size or grpo_config.world_size)
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
