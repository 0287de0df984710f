"""What a responder is, without any backend: the ``Responder`` protocol and ``ContinuationLogprob``.

Light on purpose (no torch, no transformers): ``memstate.responders.remote`` and the reward's callers import it without
loading a model stack (``memstate.responders`` re-exports both names).
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
    could not answer (an HTTP backend after its retry budget); the in-process backend never returns it.

    ``context_length`` (the tokens a prompt and its answer may take; None: unknown) and ``count_prompt_tokens`` let
    ``memstate.reward.fit`` drop facts from a prompt too long for the responder. Both are optional: a responder
    without them is shown every fact (callers read them with ``getattr`` defaults)."""

    name: str
    identity: str
    context_length: int | None

    def answer(self, prompts: list[list[Message]], max_new_tokens: int = 32) -> list[str | None]:
        """Greedy (temperature 0) answers to chat prompts."""
        ...

    def answer_logprob(
        self, prompts: list[list[Message]], continuations: list[list[str]]
    ) -> list[list[ContinuationLogprob] | None]:
        """For each prompt, the log-probability of each of its candidate answer continuations."""
        ...

    def count_prompt_tokens(self, prompts: list[list[Message]]) -> list[int | None]:
        """Each chat prompt's length in tokens, exactly as the responder will read it (None: could not count)."""
        ...
