"""An LLM extractor: any OpenAI-compatible ``/v1/chat/completions`` endpoint (a ``vllm serve`` in production),
asked for JSON that follows ``PROPOSAL_SCHEMA`` through ``response_format: json_schema``.

A server that is unreachable or answers 5xx/429 is retried (bounded, with backoff); if every attempt failed that
way, ``ExtractorError`` is raised and nothing of the session is written, so it can be ingested later. A reply that
is not JSON, or JSON that breaks the schema, is retried too; if no attempt gives a valid reply, the proposal comes
back with ``errors`` and the store rejects the session with those reasons (logged) — one garbled reply never stops
a long ingest. A valid reply is still checked like any proposal (verbatim quotes, edges, concept tree).

Relations: the model proposes SUPERSEDES / CONFLICTS_WITH by its own reading, not by the one relation rule
(``memory.relation_rule``) that the rule and turn extractors and the PersonaMem training data follow; they are
kept as proposed (after the store's checks), so its stores record ``relation_rule`` = ``llm:<prompt version>``,
and a policy trained on the rule's edges meets edges drawn another way.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import jsonschema_rs

from memstate.memory.llm_client import ChatJSON, LLMError, parse_json_reply
from memstate.memory.records import (
    CONCEPT_OPS,
    FACT_RELATIONS,
    MAX_FACTS_PER_SESSION,
    MEMORY_KINDS,
    MEMORY_SCOPES,
    ConceptEdit,
    FactProposal,
    Proposal,
    RelationProposal,
    StoredFact,
    Turn,
)

logger = logging.getLogger("memstate.memory")

EXTRACT_PROMPT_VERSION = "ms-extract-v1"
_NULLABLE_STR = {"type": ["string", "null"]}
PROPOSAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["facts", "concepts", "relations"],
    "properties": {
        "facts": {
            "type": "array",
            "maxItems": MAX_FACTS_PER_SESSION,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["key", "text", "kind", "scope", "turn", "quote", "concepts"],
                "properties": {
                    "key": {"type": "string", "pattern": "^n[0-9]+$"},
                    "text": {"type": "string", "minLength": 1},
                    "kind": {"enum": list(MEMORY_KINDS)},
                    "scope": {"enum": list(MEMORY_SCOPES)},
                    "turn": {"type": ["integer", "null"]},
                    "quote": {"type": "string", "minLength": 1},
                    "concepts": {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 4},
                },
            },
        },
        "concepts": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["op", "name", "parent", "into", "parts"],
                "properties": {
                    "op": {"enum": list(CONCEPT_OPS)},
                    "name": {"type": "string", "minLength": 1},
                    "parent": _NULLABLE_STR,
                    "into": _NULLABLE_STR,
                    "parts": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["name", "facts"],
                            "properties": {
                                "name": {"type": "string", "minLength": 1},
                                "facts": {"type": "array", "items": {"type": "string"}},
                            },
                        },
                    },
                },
            },
        },
        "relations": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["src", "type", "dst"],
                "properties": {
                    "src": {"type": "string"},
                    "type": {"enum": list(FACT_RELATIONS)},
                    "dst": {"type": "string"},
                },
            },
        },
    },
}
_VALIDATOR = jsonschema_rs.validator_for(PROPOSAL_SCHEMA)

EXTRACT_SYSTEM = (
    "You maintain the long-term memory of a personal assistant about its user. From one dialogue session, extract "
    f"at most {MAX_FACTS_PER_SESSION} atomic facts about the user: what they prefer (preference), know or state "
    "about themselves (fact), believe (belief), did or went through (experience), or must respect (constraint). "
    "Each fact is one self-contained sentence (text), its scope (global; domain: one area of life; task: one task; "
    "situation: only now), the index of the turn it comes from, and a quote copied character for character from "
    "that turn. Give new facts the keys n1, n2, …. Add a relation SUPERSEDES when a fact replaces an earlier one "
    "(a changed preference, a corrected fact) and CONFLICTS_WITH when two facts contradict each other; an end is a "
    "new key or the id of an existing memory (m12). Keep the concept tree tidy: CREATE a concept (with an optional "
    "parent) for a new topic, MERGE a concept into another that means the same, SPLIT a concept into named parts "
    "listing the facts each takes. Reply with JSON only."
)


class ExtractorError(RuntimeError):
    """The extraction server could not be reached or kept failing; nothing of the session was written."""


def extraction_messages(turns: Sequence[Turn], context: Sequence[StoredFact]) -> list[dict[str, str]]:
    """The chat prompt: existing memories (with their state and concepts), then the session's numbered turns."""
    memories = []
    for f in context:
        state = f"superseded by {', '.join(f.superseded_by)}" if f.superseded_by else "current"
        concepts = f"; concepts: {', '.join(f.concepts)}" if f.concepts else ""
        memories.append(f"[{f.id}] ({f.kind}, {f.scope}, {state}{concepts}) {f.text}")
    session = [f"[turn {i}] {t.role}{f' ({t.time})' if t.time else ''}: {t.content}" for i, t in enumerate(turns)]
    user = (
        "Existing memories:\n"
        + ("\n".join(memories) or "(none)")
        + "\n\nSession:\n"
        + "\n".join(session)
        + '\n\nReply with {"facts": [...], "concepts": [...], "relations": [...]}.'
    )
    return [{"role": "system", "content": EXTRACT_SYSTEM}, {"role": "user", "content": user}]


def parse_reply(content: str) -> Proposal:
    """A model's reply → Proposal; raises ValueError naming what is wrong (not JSON, or which field breaks the
    schema). A ``<think>`` block and a Markdown code fence around the JSON are tolerated."""
    return proposal_from(parse_json_reply(content, _VALIDATOR))


def proposal_from(data: dict[str, Any]) -> Proposal:
    """A reply already checked against ``PROPOSAL_SCHEMA`` → Proposal."""
    return Proposal(
        facts=tuple(
            FactProposal(f["key"], f["text"], f["kind"], f["scope"], f["quote"], f["turn"], tuple(f["concepts"]))
            for f in data["facts"]
        ),
        concepts=tuple(
            ConceptEdit(
                c["op"], c["name"], c["parent"], c["into"], tuple((p["name"], tuple(p["facts"])) for p in c["parts"])
            )
            for c in data["concepts"]
        ),
        relations=tuple(RelationProposal(r["src"], r["type"], r["dst"]) for r in data["relations"]),
    )


class LLMExtractor:
    """``propose`` through an OpenAI-compatible chat endpoint (``memory.llm_client.ChatJSON`` over ``memstate.http``,
    like every LLM call of the memory package). ``url`` is the server root (``/v1`` optional).

    A server that fails every attempt, or refuses the request, raises ``ExtractorError`` (nothing is written; the
    ingest stops); replies that never become a valid proposal reject only this session, with the reasons."""

    relation_rule = f"llm:{EXTRACT_PROMPT_VERSION}"  # recorded by the store: not the rule's edges (module docstring)

    def __init__(
        self,
        url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        retries: int = 2,
        backoff: float = 0.5,
        temperature: float = 0.0,
        max_tokens: int = 4096,
    ) -> None:
        self.chat = ChatJSON(url, model, api_key=api_key, timeout=timeout, retries=retries, backoff=backoff,
                             temperature=temperature, max_tokens=max_tokens)  # fmt: skip

    @property
    def calls(self) -> int:
        return self.chat.calls

    def propose(self, turns: Sequence[Turn], context: Sequence[StoredFact]) -> Proposal:
        try:
            data = self.chat.ask(extraction_messages(turns, context), PROPOSAL_SCHEMA, "memory_proposal")
        except LLMError as e:
            if e.rejected:
                raise ExtractorError(e.rejected) from None
            if not e.invalid:
                raise ExtractorError(f"extraction server {self.chat.url} failed: {'; '.join(e.failed)}") from None
            return Proposal(errors=tuple(e.invalid + e.failed))
        return proposal_from(data)

    def close(self) -> None:
        self.chat.close()

    def __enter__(self) -> LLMExtractor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
