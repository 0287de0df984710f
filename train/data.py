"""Instances → the GRPO dataset: conversational policy prompts within a token budget, plus the Instance columns."""

from __future__ import annotations

import logging

from datasets import Dataset

from memstate.prompts import policy_messages
from memstate.schema import Instance

logger = logging.getLogger("memstate.train")


def prompt_tokens(tokenizer, instance: Instance, facts=None) -> int:
    messages = policy_messages(instance, facts)
    return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def fit_prompt(tokenizer, instance: Instance, max_tokens: int) -> tuple[list[dict], int]:
    """The policy prompt with facts dropped from the end until it fits ``max_tokens`` (the question is never cut).

    Returns the messages and how many facts were dropped. An instance whose question alone does not fit keeps
    one fact and is reported (its prompt is left to the trainer's own limits)."""
    facts = instance.facts
    if prompt_tokens(tokenizer, instance, facts) <= max_tokens:
        return policy_messages(instance, facts), 0
    lo, hi = 1, len(facts)  # binary search for the most facts that fit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if prompt_tokens(tokenizer, instance, facts[:mid]) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    if prompt_tokens(tokenizer, instance, facts[:lo]) > max_tokens:
        logger.warning("instance %s: the question alone exceeds %d prompt tokens", instance.id, max_tokens)
    return policy_messages(instance, facts[:lo]), len(facts) - lo


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
