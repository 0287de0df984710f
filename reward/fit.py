"""Fit what the responder is shown to the responder's context: facts dropped from the end, never the question.

The policy's prompt is fitted to its budget (``memstate.prompts.fit_prompt``); the responder's prompt shows the
instance's facts, and one longer than the responder's context would be refused by a vLLM server (HTTP 400: the reward
unscorable, every time) or run past an in-process model's positions. ``fit_to_responder`` returns, for each instance
whose no-state responder prompt exceeds ``context_length - RESERVE`` tokens, a copy with the most facts that fit
(relations between kept facts kept, as the policy's fitting shows them); any other instance is returned itself. The
reward fits its instances before anything is scored or any baseline cache key is made, and evaluation before its
judgements, so the baseline and the with-state prompts show the same facts (the gain compares like with like) and a
baseline is cached under the request actually sent.

A responder says what it can hold with ``context_length`` (``OpenAIResponder``: the ``max_model_len`` its server
reports; ``TransformersResponder``: the model's ``max_position_embeddings``) and counts a chat prompt's tokens as it
will read it with ``count_prompt_tokens``. A responder without them (or one whose context is unknown) is shown every
fact, as before. Each distinct prompt is measured once per process (per responder identity, context and reserve).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Sequence

from memstate.prompts import Message, responder_messages, responder_request_messages
from memstate.schema import Instance

logger = logging.getLogger("memstate.reward")

# Tokens of the responder's context kept free beyond the no-state prompt: the state (up to 512 policy tokens —
# ``max_completion_length`` — at most 80 words once parsed, with the "Rules for using the memories:" header and
# its ``- `` lines) and the answer (one letter, at most 16 generated tokens in exact mode, or a teacher-forced
# free-text reference).
RESERVE = 1024

# (responder identity, context length, reserve, digest of the no-state prompt) -> facts kept (None: all of them).
_KEPT: dict[tuple[str, int, int, str], int | None] = {}
_warned = False


def _digest(messages: list[Message]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _first_facts(instance: Instance, n: int) -> list[Message]:
    """The no-state responder prompt of ``instance`` with only its first ``n`` facts."""
    return responder_request_messages(instance.question, instance.candidates, instance.facts[:n], instance.relations)


def cut_instance(instance: Instance, n: int) -> Instance:
    """A copy of ``instance`` with its first ``n`` facts and the relations between them (the prompt shows the same
    edges either way: an edge to a dropped fact is left out of the prompt too).

    >>> from memstate.schema import Fact, Relation
    >>> inst = Instance("x", "personamem", "preference_update", "none", "Which city?", ("Bergen", "Oslo"), "B",
    ...                 "choice", (), (Fact("F1", "I live in Bergen.", "fact"), Fact("F2", "I moved to Oslo.", "fact"),
    ...                 Fact("F3", "I like tea.", "preference")), (Relation("F2", "SUPERSEDES", "F1"),))
    >>> [f.id for f in cut_instance(inst, 2).facts], len(cut_instance(inst, 2).relations)
    (['F1', 'F2'], 1)
    >>> cut_instance(inst, 1).relations
    ()
    >>> responder_messages(cut_instance(inst, 1)) == _first_facts(inst, 1)
    True
    """
    facts = instance.facts[:n]
    kept = {f.id for f in facts}
    relations = tuple(r for r in instance.relations if r.src in kept and r.dst in kept)
    return dataclasses.replace(instance, facts=facts, relations=relations)


def fit_to_responder(responder, instances: Sequence[Instance], reserve: int = RESERVE) -> list[Instance]:
    """Each instance as the responder is to be shown it: itself when its no-state prompt fits ``context_length -
    reserve`` tokens (or the responder's context is unknown, or a count failed: retried next time), else a copy with
    facts dropped from the end until it fits (binary search; at least one fact is kept, and an instance whose
    question alone does not fit is logged). Cut copies are new objects: ``fitted is not instance`` says it was cut.
    Fitting a fitted instance returns it unchanged."""
    context = getattr(responder, "context_length", None)
    count = getattr(responder, "count_prompt_tokens", None)
    if context is None or count is None:
        return list(instances)
    budget = context - reserve
    identity = str(getattr(responder, "identity", None) or getattr(responder, "name", type(responder).__name__))
    # TRL repeats each instance G times (the same object): each distinct one is keyed, and cut, once.
    distinct = {id(inst): inst for inst in instances}
    keys = {i: (identity, context, reserve, _digest(responder_messages(inst))) for i, inst in distinct.items()}
    todo = {key: distinct[i] for i, key in keys.items() if key not in _KEPT}
    if todo:
        _measure(count, todo, budget, context, reserve)
    shown = {}
    for i, inst in distinct.items():
        n = _KEPT.get(keys[i])  # absent: its count failed, shown whole (retried next call)
        shown[i] = inst if n is None or n >= len(inst.facts) else cut_instance(inst, n)
    return [shown[id(inst)] for inst in instances]


def _measure(count, todo: dict[tuple, Instance], budget: int, context: int, reserve: int) -> None:
    """Count each prompt of ``todo`` whole, then binary-search the facts of those over ``budget``, all instances of a
    round in one ``count`` call (one batch of requests for an HTTP responder)."""
    global _warned
    items = list(todo.items())
    whole = count([responder_messages(inst) for _, inst in items])
    searches = []  # [key, instance, tokens whole, lo, hi]: the most facts that fit lie in [lo, hi]
    for (key, inst), tokens in zip(items, whole, strict=True):
        if tokens is None:
            continue
        if tokens <= budget or len(inst.facts) == 1:
            _KEPT[key] = None
            if tokens > budget:
                logger.warning("instance %s: its responder prompt (%d tokens, one fact) exceeds the responder's "
                               "context %d less %d reserved", inst.id, tokens, context, reserve)  # fmt: skip
        else:
            searches.append([key, inst, tokens, 1, len(inst.facts) - 1])
    while active := [s for s in searches if s[3] < s[4]]:
        mids = [(s[3] + s[4] + 1) // 2 for s in active]
        counted = count([_first_facts(s[1], mid) for s, mid in zip(active, mids, strict=True)])
        for s, mid, tokens in zip(active, mids, counted, strict=True):
            if tokens is None:  # given up on for now: shown whole this time, measured again next time
                searches.remove(s)
            elif tokens <= budget:
                s[3] = mid
            else:
                s[4] = mid - 1
    alone = [s for s in searches if s[3] == 1]  # does even one fact fit?
    for s, tokens in zip(alone, count([_first_facts(s[1], 1) for s in alone]) if alone else [], strict=True):
        if tokens is not None and tokens > budget:
            logger.warning("instance %s: its question alone exceeds the responder's context %d less %d reserved "
                           "(%d tokens with one fact)", s[1].id, context, reserve, tokens)  # fmt: skip
    for key, inst, tokens, kept, _ in searches:
        _KEPT[key] = kept
        fitted_key = (*key[:3], _digest(_first_facts(inst, kept)))
        _KEPT[fitted_key] = None  # a fitted instance fits as it is
        if not _warned:
            _warned = True
            logger.warning(
                "the responder's context is %d tokens, %d of them kept for a state and the answer: instance %s's "
                "responder prompt has %d tokens, shown with its first %d of %d facts (each instance cut so is counted "
                "in memstate/responder_facts_cut; further cuts are logged at debug level)",
                context, reserve, inst.id, tokens, kept, len(inst.facts),
            )  # fmt: skip
        else:
            logger.debug("instance %s: responder prompt of %d tokens, shown with %d of %d facts", inst.id, tokens,
                         kept, len(inst.facts))  # fmt: skip


def facts_cut(instances: Sequence[Instance], fitted: Sequence[Instance]) -> int:
    """How many distinct instances ``fit_to_responder`` cut."""
    return len({inst.id for inst, shown in zip(instances, fitted, strict=True) if shown is not inst})
