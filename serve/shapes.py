"""The reasoning-state API's request and response bodies, shared by the service (``api.py``) and its client.

A request's facts and relations are the schema's own classes (``memstate.schema``: ``ShownFact``, i.e. a Fact
without its analysis-only role, and ``Relation``), so the OpenAPI document and the validation come from the one
definition. Every shape is strict: an unknown field is a 422.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from memstate.schema import NonBlank, Relation, ShownFact


class ReasoningStateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: NonBlank = Field(examples=["Where do I live now?"])
    facts: list[ShownFact] = Field(min_length=1)
    relations: list[Relation] = Field(default_factory=list)
    options: list[NonBlank] = Field(
        default_factory=list, description="Multiple-choice options, if any: none or at least two."
    )


class ReasoningStateResponse(BaseModel):
    """The API's answer. ``rules`` is empty when ``format_ok`` is false: answer without a state then."""

    model_config = ConfigDict(frozen=True)
    rules: tuple[str, ...] = Field(description="2–4 imperative rules; empty when format_ok is false.")
    text: str = Field(description="The policy's last reply, verbatim.")
    format_ok: bool
    format_error: str | None = Field(description="Why the last reply is not a reasoning state (format_ok false).")
    names_option: str | None = Field(
        description="Why the rules name one of the request's options (letter, position or text; the leak gate of "
        "training and evaluation), or null. Reported, not enforced: the caller decides whether to use such rules."
    )
    attempts: int = Field(description="Policy calls made (1 + format retries used).")
    facts_truncated: int = Field(description="Facts left out of the prompt to fit the token budget.")
    model: str
    prompt_version: str
    latency_ms: float
