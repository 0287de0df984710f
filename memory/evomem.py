"""The dense backends: ``naive`` (NaiveRAG) and ``evomem`` (EvoMemState).

- ``naive``: the ``k`` facts most similar to the query and nothing else: no traversal and no relations, as a plain
  dense retriever would give them to the policy.
- ``evomem``: ``k`` seeds by hybrid search (``MemoryStore.hybrid``: dense and BM25 candidates fused by reciprocal rank;
  names, dates and rare words are found lexically, paraphrase densely), each of the best ``REPLIES`` followed by the
  next fact of its session (in a dialogue the answer to a matching turn is often the turn after it), then the stored
  SUPERSEDES / CONFLICTS_WITH edges followed in both directions up to ``depth`` hops — so a query that matches only an
  old preference also brings the preference that replaced it, and a belief brings what contradicts it —
  de-duplicated, each seed in similarity order followed by the facts its traversal reached (nearest first), so a
  prompt truncated from the end loses the least relevant.
"""

from __future__ import annotations

from typing import Any

from memstate.memory.backends import Backend, Query, register
from memstate.memory.store import MemoryStore


def naive_search(query: Query) -> tuple[list[str], dict[str, Any]]:
    return [ref for ref, _ in query.store.nearest(query.vector, query.k)], {}


REPLIES = 3  # LoCoMo at 565 tokens: recall +0.010, hit +0.014 (1 reply: +0.010, +0.010)


def evomem_search(query: Query) -> tuple[list[str], dict[str, Any]]:
    seeds = with_replies(query.store, query.store.hybrid(query.text, query.vector, query.k), REPLIES)
    return traverse(query.store, seeds, query.depth, query.limit), {}


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
