"""What a responder is, without any backend: the ``Responder`` protocol and ``ContinuationLogprob``.

Light on purpose (no torch, no transformers): ``memstate.http_responder`` and the reward's callers import it without
loading a model stack. ``memstate.responder`` re-exports both names.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from memstate.prompts import Message


class ContinuationLogprob(NamedTuple):
    """Summed log-probability of a continuation and its token count (for length normalization)."""

    logprob: float
    n_tokens: int


class Responder(Protocol):
    """``name`` is a readable label (logs, reports). ``identity`` says which weights, precision and serving answer:
    it is part of the baseline cache key, so two responders with the same identity must score the same request the
    same, and anything that changes the scores must change it. A result is ``None`` for a prompt the responder
    could not answer (an HTTP backend after its retry budget); the in-process backend never returns it."""

    name: str
    identity: str

    def answer(self, prompts: list[list[Message]], max_new_tokens: int = 32) -> list[str | None]:
        """Greedy (temperature 0) answers to chat prompts."""
        ...

    def answer_logprob(
        self, prompts: list[list[Message]], continuations: list[list[str]]
    ) -> list[list[ContinuationLogprob] | None]:
        """For each prompt, the log-probability of each of its candidate answer continuations."""
        ...
