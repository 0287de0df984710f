"""The dense backends: ``naive`` (NaiveRAG) and ``evomem`` (EvoMemState).

- ``naive``: the ``k`` facts most similar to the query and nothing else: no traversal and no relations, as a plain
  dense retriever would give them to the policy.
- ``evomem``: ``k`` seeds by hybrid search (``MemoryStore.hybrid``: dense and BM25 candidates fused by reciprocal rank;
  names, dates and rare words are found lexically, paraphrase densely), then the stored SUPERSEDES / CONFLICTS_WITH
  edges followed in both directions up to ``depth`` hops — so a query that matches only an old preference also brings
  the preference that replaced it, and a belief brings what contradicts it — de-duplicated, each seed in similarity
  order followed by the facts its traversal reached (nearest first), so a prompt truncated from the end loses the least
  relevant.
"""

from __future__ import annotations

from typing import Any

from memstate.memory.backends import Backend, Query, register
from memstate.memory.store import MemoryStore


def naive_search(query: Query) -> tuple[list[str], dict[str, Any]]:
    return [ref for ref, _ in query.store.nearest(query.vector, query.k)], {}


def evomem_search(query: Query) -> tuple[list[str], dict[str, Any]]:
    seeds = query.store.hybrid(query.text, query.vector, query.k)
    return traverse(query.store, seeds, query.depth, query.limit), {}


def traverse(store: MemoryStore, seeds: list[str], depth: int, limit: int) -> list[str]:
    """Seeds in order, each followed by the facts reachable from it within ``depth`` hops (breadth first) that no
    earlier seed reached; ``limit`` facts in all, but every seed is kept."""
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
                    if other in placed or other in out or extra <= 0:
                        continue
                    result.append(other)
                    placed.add(other)
                    nxt.append(other)
                    extra -= 1
            frontier = nxt
    return result


register(
    Backend(
        name="evomem",
        summary="EvoMemState: hybrid (dense + BM25) seeds, then the stored SUPERSEDES/CONFLICTS_WITH edges up to depth "
        "hops",
        search=evomem_search,
        decisions=("none (hybrid seeds + stored relations)",) * 2,
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
