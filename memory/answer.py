"""State-aware answering: retrieve memories, ask the reasoning-state API for rules, ask the responder.

``memstate memory ask --store DB "question"``: the paper's third stage. The responder sees the retrieved facts
(evidence + memories), the relational state drawn between them, and — unless ``no_state`` or the policy's reply
failed the format — the reasoning state's rules, in the same responder prompt as training and evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memstate.memory.retrieve import Retrieved, retrieve
from memstate.memory.store import MemoryStore
from memstate.prompts import responder_request_messages
from memstate.responders import Responder
from memstate.serve.client import ReasoningStateClient, payload


@dataclass(frozen=True)
class Answer:
    question: str
    answer: str | None  # None: the responder could not answer (e.g. unreachable after retries)
    rules: tuple[str, ...]  # empty: answered without a state
    state_format_ok: bool | None  # None: no state was asked for
    retrieved: Retrieved


def ask(
    store: MemoryStore,
    question: str,
    responder: Responder,
    *,
    state_api: ReasoningStateClient | None = None,
    options: Sequence[str] = (),
    backend: str = "evomem",
    k: int = 10,
    budget_tokens: int | None = None,
    tokenizer: str | None = None,
    max_new_tokens: int = 128,
) -> Answer:
    """Answer ``question`` from the store (``k`` seed facts, or as many as fit in ``budget_tokens`` of ``tokenizer``:
    ``retrieve``); with ``state_api`` the rules of the served policy guide the responder."""
    retrieved = retrieve(store, question, k=k, backend=backend, budget_tokens=budget_tokens, tokenizer=tokenizer)
    rules: tuple[str, ...] = ()
    format_ok = None
    if state_api is not None and retrieved.facts:
        state = state_api.reasoning_state(payload(question, retrieved.facts, retrieved.relations, options))
        format_ok = state.format_ok
        rules = state.rules
    messages = responder_request_messages(question, options, retrieved.facts, retrieved.relations, rules or None)
    (text,) = responder.answer([messages], max_new_tokens=max_new_tokens)
    return Answer(question, None if text is None else text.strip(), rules, format_ok, retrieved)
