"""Induction: the extractor interface and its two implementations.

An extractor reads one session (its turns) and the stored facts most related to it (``context``, chosen by the
store) and proposes new atomic facts, concept edits and relation edges. It writes nothing: the store checks every
proposal (``memstate.memory.validate``) and commits the session atomically.

- ``TurnExtractor`` (``memstate.memory.turn_extractor``): every turn a fact; the default (``DEFAULT_EXTRACTOR``).
- ``RuleExtractor`` (``memstate.memory.rule_extractor``): no model; first-person cue sentences; a baseline.
- ``LLMExtractor`` (``memory.llm_extractor``): an OpenAI-compatible endpoint with JSON-schema output.

``make_extractor`` is the one place that turns a name into an extractor: ``memory ingest``, ``eval memsyco`` and
``eval sweep`` ingest through it, so they store the same facts and relations (the rule extractors' relations come
from ``memory.relation_rule``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from memstate.errors import ConfigError
from memstate.memory.llm_extractor import (
    EXTRACT_PROMPT_VERSION,
    PROPOSAL_SCHEMA,
    ExtractorError,
    LLMExtractor,
    parse_reply,
)
from memstate.memory.records import ConceptEdit, FactProposal, Proposal, RelationProposal, StoredFact, Turn
from memstate.memory.rule_extractor import RuleExtractor

EXTRACTORS = ("turns", "rule", "llm")
DEFAULT_EXTRACTOR = "turns"


@runtime_checkable
class Extractor(Protocol):
    """Proposes facts, concept edits and relations for one session; never writes."""

    def propose(self, turns: Sequence[Turn], context: Sequence[StoredFact]) -> Proposal: ...


def make_extractor(name: str = DEFAULT_EXTRACTOR, url: str | None = None, model: str | None = None) -> Extractor:
    """The extractor called ``name`` (one of ``EXTRACTORS``), as ``memstate memory ingest --extractor NAME`` makes
    it: no embedder (the relation rule's shared-words test). ``llm`` needs the endpoint ``url`` and ``model``.

    >>> type(make_extractor()).__name__, type(make_extractor("rule")).__name__
    ('TurnExtractor', 'RuleExtractor')
    """
    from memstate.memory.turn_extractor import TurnExtractor

    if name not in EXTRACTORS:
        raise ConfigError(f"unknown extractor {name!r}; known: {', '.join(EXTRACTORS)}")
    if name == "llm":
        if not url or not model:
            raise ConfigError("--extractor llm needs --extractor-url and --extractor-model")
        return LLMExtractor(url, model)
    return RuleExtractor() if name == "rule" else TurnExtractor()


__all__ = [
    "DEFAULT_EXTRACTOR",
    "EXTRACTORS",
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
    "make_extractor",
    "parse_reply",
]
