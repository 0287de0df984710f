"""The memory pipeline: an ontology-guided memory store (SQLite), induction per session (rule-based or LLM
extractor, every proposal validated, sessions committed atomically), relation-aware retrieval (EvoMemState) and a
dense baseline (NaiveRAG), returning facts and relational state in the Instance shapes of DESIGN.md."""

from memory.embed import Embedder, HashEmbedder, SentenceTransformerEmbedder, default_embedder
from memory.extract import Extractor, ExtractorError, LLMExtractor, RuleExtractor
from memory.ingest import (
    IngestError,
    memsyco_file_sessions,
    memsyco_sessions,
    personamem_sessions,
    read_dialogue_jsonl,
    read_sessions,
)
from memory.records import IngestReport, Proposal, Session, StoredFact, Turn
from memory.retrieve import Retrieved, retrieve
from memory.store import MemoryStore, StoreError

__all__ = [
    "Embedder",
    "Extractor",
    "ExtractorError",
    "HashEmbedder",
    "IngestError",
    "IngestReport",
    "LLMExtractor",
    "MemoryStore",
    "Proposal",
    "Retrieved",
    "RuleExtractor",
    "SentenceTransformerEmbedder",
    "Session",
    "StoreError",
    "StoredFact",
    "Turn",
    "default_embedder",
    "memsyco_file_sessions",
    "memsyco_sessions",
    "personamem_sessions",
    "read_dialogue_jsonl",
    "read_sessions",
    "retrieve",
]
