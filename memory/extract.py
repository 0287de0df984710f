"""Induction: the extractor interface and its two implementations.

An extractor reads one session (its turns) and the stored facts most related to it (``context``, chosen by the
store) and proposes new atomic facts, concept edits and relation edges. It writes nothing: the store checks every
proposal (``memstate.memory.validate``) and commits the session atomically.

- ``RuleExtractor`` (``memstate.memory.rule_extractor``): no model; the embedded default and a baseline.
- ``LLMExtractor`` (``memory.llm_extractor``): an OpenAI-compatible endpoint with JSON-schema output; production.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from memstate.memory.llm_extractor import (
    EXTRACT_PROMPT_VERSION,
    PROPOSAL_SCHEMA,
    ExtractorError,
    LLMExtractor,
    parse_reply,
)
from memstate.memory.records import ConceptEdit, FactProposal, Proposal, RelationProposal, StoredFact, Turn
from memstate.memory.rule_extractor import RuleExtractor


@runtime_checkable
class Extractor(Protocol):
    """Proposes facts, concept edits and relations for one session; never writes."""

    def propose(self, turns: Sequence[Turn], context: Sequence[StoredFact]) -> Proposal: ...


__all__ = [
    "EXTRACT_PROMPT_VERSION",
    "PROPOSAL_SCHEMA",
    "ConceptEdit",
    "Extractor",
    "ExtractorError",
    "FactProposal",
    "LLMExtractor",
    "Proposal",
    "RelationProposal",
    "RuleExtractor",
    "StoredFact",
    "Turn",
    "parse_reply",
]
