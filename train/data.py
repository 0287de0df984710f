"""Instances → the GRPO dataset: conversational policy prompts within a token budget, plus the Instance columns."""

from __future__ import annotations

import logging

from datasets import Dataset

from memstate.prompts import fit_policy_prompt, policy_messages
from memstate.schema import Instance

logger = logging.getLogger("memstate.train")


def prompt_tokens(tokenizer, instance: Instance, facts=None) -> int:
    messages = policy_messages(instance, facts)
    return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def fit_prompt(tokenizer, instance: Instance, max_tokens: int) -> tuple[list[dict], int]:
    """The policy prompt within ``max_tokens`` (facts dropped from the end, never the question) and how many facts
    were dropped; an instance whose question alone does not fit is reported."""
    messages, dropped = fit_policy_prompt(
        tokenizer, instance.question, instance.candidates, instance.facts, instance.relations, max_tokens
    )
    if dropped and prompt_tokens(tokenizer, instance, instance.facts[: len(instance.facts) - dropped]) > max_tokens:
        logger.warning("instance %s: the question alone exceeds %d prompt tokens", instance.id, max_tokens)
    return messages, dropped


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
