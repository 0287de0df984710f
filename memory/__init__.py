"""The memory pipeline: an ontology-guided memory store (SQLite), induction per session (rule-based or LLM
extractor, every proposal validated, sessions committed atomically), relation-aware retrieval (EvoMemState), a
dense baseline (NaiveRAG), agent-driven clustering (CLAG) and seed-fragment-path search (MemSearch-o1), returning facts
and relational state in the Instance shapes of docs/design.md."""

from memstate.embedding import Embedder
from memstate.memory.backends import Backend, Query, backend_names, get_backend, register
from memstate.memory.clag import ClagConfig, ClagMemory, clag_memory
from memstate.memory.embed import HashEmbedder, SentenceTransformerEmbedder, default_embedder
from memstate.memory.extract import Extractor, ExtractorError, LLMExtractor, RuleExtractor
from memstate.memory.ingest import (
    IngestError,
    locomo_sessions,
    memsyco_file_sessions,
    memsyco_sessions,
    personamem_sessions,
    read_dialogue_jsonl,
    read_sessions,
)
from memstate.memory.llm_client import ChatJSON, LLMError
from memstate.memory.memsearch import MemSearchConfig, contribution, greedy_path, memsearch
from memstate.memory.records import IngestReport, Proposal, Session, StoredFact, Turn
from memstate.memory.retrieve import Retrieved, retrieve
from memstate.memory.store import MemoryStore, StoreError

__all__ = [
    "Backend",
    "Query",
    "backend_names",
    "get_backend",
    "register",
    "ChatJSON",
    "ClagConfig",
    "ClagMemory",
    "Embedder",
    "Extractor",
    "ExtractorError",
    "HashEmbedder",
    "IngestError",
    "IngestReport",
    "LLMError",
    "LLMExtractor",
    "MemSearchConfig",
    "MemoryStore",
    "Proposal",
    "Retrieved",
    "RuleExtractor",
    "SentenceTransformerEmbedder",
    "Session",
    "StoreError",
    "StoredFact",
    "Turn",
    "clag_memory",
    "contribution",
    "default_embedder",
    "greedy_path",
    "locomo_sessions",
    "memsearch",
    "memsyco_file_sessions",
    "memsyco_sessions",
    "personamem_sessions",
    "read_dialogue_jsonl",
    "read_sessions",
    "retrieve",
]
