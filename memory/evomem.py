"""The dense backends: ``naive`` (NaiveRAG) and ``evomem`` (EvoMemState).

- ``naive``: the ``k`` facts most similar to the query and nothing else: no traversal and no relations, as a plain
  dense retriever would give them to the policy.
- ``evomem``: ``k`` seeds by hybrid search (``MemoryStore.hybrid``: dense and BM25 candidates fused by reciprocal rank;
  names, dates and rare words are found lexically, paraphrase densely; a question that names a calendar date adds a
  third list, the nearest facts said then: ``memory.dates``) run twice: the second time with the query's
  vector moved toward its first results (pseudo-relevance feedback, Rocchio's rule: a short question says little, the
  turns it matches best say how the conversation words it), each of the best ``replies`` followed by the
  next fact of its session (in a dialogue the answer to a matching turn is often the turn after it), then the stored
  SUPERSEDES / CONFLICTS_WITH edges followed in both directions up to ``depth`` hops — so a query that matches only an
  old preference also brings the preference that replaced it, and a belief brings what contradicts it —
  de-duplicated, each seed in similarity order followed by the facts its traversal reached (nearest first), so a
  prompt truncated from the end loses the least relevant.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from memstate.memory.backends import Backend, Query, register
from memstate.memory.dates import question_span
from memstate.memory.embed import normalize
from memstate.memory.search import HYBRID_POOL, RRF_K
from memstate.memory.store import MemoryStore


def naive_search(query: Query) -> tuple[list[str], dict[str, Any]]:
    return [ref for ref, _ in query.store.nearest(query.vector, query.k)], {}


@dataclass(frozen=True)
class EvomemSettings:
    """evomem's query-time settings. The defaults were chosen on LoCoMo's five shipped conversations and kept only
    where they help on a conversation left out of the choice (``benchmarks/retrieval_cv.py``, docs/memory.md)."""

    replies: int = field(
        default=3, metadata={"help": "The best seeds each followed by the next fact of their session (its reply)."}
    )
    feedback_facts: int = field(
        default=3, metadata={"help": "Pseudo-relevance feedback: the first results the query's vector moves toward."}
    )
    feedback_weight: float = field(default=0.5, metadata={"help": "How far: q + w * mean, renormalized."})
    dates: bool = field(
        default=True, metadata={"help": "A question that names a date also ranks the facts said then (memory.dates)."}
    )
    pool: int = field(default=HYBRID_POOL, metadata={"help": "Dense and lexical candidates fused per search."})
    rrf_k: int = field(default=RRF_K, metadata={"help": "Reciprocal rank fusion's constant."})

    def __post_init__(self) -> None:
        for name, least in {"replies": 0, "feedback_facts": 0, "pool": 1, "rrf_k": 1}.items():
            if getattr(self, name) < least:
                raise ValueError(f"{name} must be at least {least}")
        if not 0 <= self.feedback_weight <= 10:
            raise ValueError("feedback_weight must be in [0, 10]")


def feedback_vector(store: MemoryStore, vector: np.ndarray, refs: list[str], weight: float) -> np.ndarray:
    """Rocchio's rule: ``vector`` (normalized) plus ``weight`` times the mean vector of the facts ``refs``,
    renormalized."""
    q = normalize(np.asarray(vector, dtype=np.float32).reshape(1, -1))[0]
    return normalize((q + weight * store.vectors(refs).mean(axis=0)).reshape(1, -1))[0]


def evomem_search(query: Query) -> tuple[list[str], dict[str, Any]]:
    s: EvomemSettings = query.settings or EvomemSettings()
    store = query.store
    span = question_span(query.text) if s.dates else None
    lexical = [ref for ref, _ in store.lexical(query.text, max(s.pool, query.k))]
    seeds = store.hybrid(query.text, query.vector, query.k, pool=s.pool, rrf_k=s.rrf_k, span=span, lexical=lexical)
    trace: dict[str, Any] = {"dates": asdict(span)} if span else {}
    if s.feedback_facts and s.feedback_weight and seeds:
        trace["feedback"] = seeds[: s.feedback_facts]
        vector = feedback_vector(store, query.vector, trace["feedback"], s.feedback_weight)
        seeds = store.hybrid(query.text, vector, query.k, pool=s.pool, rrf_k=s.rrf_k, span=span, lexical=lexical)
    return traverse(store, with_replies(store, seeds, s.replies), query.depth, query.limit), trace


def with_replies(store: MemoryStore, seeds: list[str], n: int) -> list[str]:
    """``seeds`` with each of the first ``n`` followed by the next fact of its session (once, where it is not a
    seed already placed before it)."""
    nxt = store.following(seeds[:n])
    out: list[str] = []
    for i, seed in enumerate(seeds):
        out.append(seed)
        if i < n and seed in nxt:
            out.append(nxt[seed])
    return list(dict.fromkeys(out))


def traverse(store: MemoryStore, seeds: list[str], depth: int, limit: int) -> list[str]:
    """Seeds in order, each followed by the facts reachable from it within ``depth`` hops (breadth first) not placed
    yet — a later seed too, moved up beside the fact it relates to (under a token budget nearly every fact of a short
    dialogue is a seed, and a related fact left at its own rank could fall outside the budget); ``limit`` facts in
    all, but every seed is kept."""
    out = dict.fromkeys(seeds)
    result: list[str] = []
    placed: set[str] = set()
    extra = max(0, limit - len(seeds))
    for seed in seeds:
        if seed in placed:
            continue
        result.append(seed)
        placed.add(seed)
        frontier = [seed]
        for _ in range(depth):
            nxt = []
            for ref in frontier:
                for src, _, dst in store.links(ref):
                    other = dst if src == ref else src
                    if other in placed or (other not in out and extra <= 0):
                        continue
                    result.append(other)
                    placed.add(other)
                    nxt.append(other)
                    extra -= other not in out
            frontier = nxt
    return result


register(
    Backend(
        name="evomem",
        summary="EvoMemState: hybrid (dense + BM25) seeds, the best seeds' replies, then the stored "
        "SUPERSEDES/CONFLICTS_WITH edges up to depth hops",
        search=evomem_search,
        decisions=("none (hybrid seeds + stored relations)",) * 2,
        settings=EvomemSettings,
    )
)
register(
    Backend(
        name="naive",
        summary="NaiveRAG: the k most similar facts, no relations",
        search=naive_search,
        decisions=("none (dense top-k)",) * 2,
        relations=False,
    )
)
