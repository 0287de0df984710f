"""Retrieval backends: facts and their relational state, in the Instance shapes of DESIGN.md.

- ``evomem`` (EvoMemState): the ``k`` facts most similar to the query (dense seeds), then the stored
  SUPERSEDES / CONFLICTS_WITH edges followed in both directions up to ``depth`` hops — so a query that matches only
  an old preference also brings the preference that replaced it, and a belief brings what contradicts it —
  de-duplicated, with the relations among the returned facts.
- ``naive`` (NaiveRAG): the ``k`` most similar facts and nothing else: no traversal and no relations, as a plain
  dense retriever would give them to the policy.

Facts come back numbered F1..Fn: each seed in similarity order, followed by the facts its traversal reached (nearest
first), so a prompt truncated from the end loses the least relevant facts. ``role`` (analysis only, never shown to a
model) is ``outdated`` for a fact some stored fact supersedes, ``gold`` otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memory.store import MemoryStore
from memstate.schema import Fact, Relation

BACKENDS = ("evomem", "naive")


@dataclass(frozen=True)
class Retrieved:
    """``facts[i]`` is stored fact ``store_ids[i]``; ``relations`` join returned facts only; ``scores[i]`` is the
    fact's cosine with the query (traversal-added facts too)."""

    facts: tuple[Fact, ...]
    relations: tuple[Relation, ...]
    store_ids: tuple[str, ...]
    scores: tuple[float, ...] = ()


def retrieve(
    store: MemoryStore,
    query: str,
    *,
    k: int = 10,
    backend: str = "evomem",
    depth: int = 2,
    max_facts: int | None = None,
    query_vector: np.ndarray | None = None,
) -> Retrieved:
    """Facts and relational state for ``query``; see the module docstring. ``max_facts`` caps the traversal
    (default ``3 * k``); ``query_vector`` skips embedding the query (it must come from the store's embedder)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {list(BACKENDS)}")
    vec = store.embed_query(query) if query_vector is None else query_vector
    seeds = store.nearest(vec, k)
    order = [ref for ref, _ in seeds]
    if backend == "evomem":
        order = _traverse(store, order, depth, max_facts if max_facts is not None else 3 * k)
    stored = store.facts(order)
    if not stored:
        return Retrieved((), (), ())
    fid = {f.id: f"F{i}" for i, f in enumerate(stored, 1)}
    facts = tuple(
        Fact(
            id=fid[f.id],
            text=f.text,
            kind=f.kind,
            scope=f.scope,
            turn=f.turn,
            time=f.time,
            role="gold" if f.current else "outdated",
        )
        for f in stored
    )
    relations: tuple[Relation, ...] = ()
    if backend == "evomem":
        edges = dict.fromkeys(e for f in stored for e in store.links(f.id) if e[0] in fid and e[2] in fid)
        relations = tuple(Relation(fid[s], t, fid[d]) for s, t, d in edges)
    scores = store.similarity([f.id for f in stored], vec)
    return Retrieved(facts, relations, tuple(f.id for f in stored), tuple(scores))


def _traverse(store: MemoryStore, seeds: list[str], depth: int, limit: int) -> list[str]:
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
