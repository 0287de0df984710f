"""Instances → the GRPO dataset: conversational policy prompts within a token budget, plus the Instance columns."""

from __future__ import annotations

import logging

from datasets import Dataset

from memstate.prompts import fit_prompt
from memstate.schema import Instance

logger = logging.getLogger("memstate.train")


def grpo_dataset(instances: list[Instance], tokenizer, max_prompt_tokens: int) -> tuple[Dataset, int]:
    """Conversational prompts plus every Instance field as a column (TRL hands the columns to the reward, which
    shows the responder all facts); returns the dataset and the number of instances whose facts were truncated."""
    rows, truncated = [], 0
    for inst in instances:
        messages, dropped = fit_prompt(tokenizer, inst, max_prompt_tokens)
        truncated += dropped > 0
        rows.append({"prompt": messages, **inst.to_dict()})
    if truncated:
        logger.info(
            "%d of %d policy prompts had facts truncated to fit %d tokens", truncated, len(rows), max_prompt_tokens
        )
    return Dataset.from_list(rows), truncated
