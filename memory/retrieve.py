"""Retrieval backends: facts and their relational state, in the Instance shapes of DESIGN.md.

- ``evomem`` (EvoMemState): the ``k`` facts most similar to the query (dense seeds), then the stored
  SUPERSEDES / CONFLICTS_WITH edges followed in both directions up to ``depth`` hops — so a query that matches only
  an old preference also brings the preference that replaced it, and a belief brings what contradicts it —
  de-duplicated, with the relations among the returned facts.
- ``naive`` (NaiveRAG): the ``k`` most similar facts and nothing else: no traversal and no relations, as a plain
  dense retriever would give them to the policy.
- ``clag`` (CLAG, ``memory.clag``): the store's facts routed into topic clusters; the query picks clusters (by an
  LLM, or by similarity to their profiles), then the ``k`` most similar facts among their members (global search
  when no cluster fits), with the relations among the returned facts.
- ``memsearch`` (MemSearch-o1, ``memory.memsearch``): seeds of the query grow fragments over a few retrieval rounds;
  fragments are scored (relevance + bridge potential) and chained into a path; the path's facts in path order, with
  the relations among them.

Facts come back numbered F1..Fn — evomem: each seed in similarity order, followed by the facts its traversal reached
(nearest first), so a prompt truncated from the end loses the least relevant facts; clag: by similarity; memsearch:
in path order. ``role`` (analysis only, never shown to a model) is ``outdated`` for a fact some stored fact
supersedes, ``gold`` otherwise. ``Retrieved.trace`` says how the backend decided (clusters chosen, LLM or rule-based,
seeds, fragments and their scores, fallbacks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from memstate.memory.clag import ClagConfig, clag_memory
from memstate.memory.llm_client import ChatJSON
from memstate.memory.memsearch import MemSearchConfig, memsearch
from memstate.memory.store import MemoryStore

from memstate.schema import Fact, Relation

BACKENDS = ("evomem", "naive", "clag", "memsearch")


@dataclass(frozen=True)
class Retrieved:
    """``facts[i]`` is stored fact ``store_ids[i]``; ``relations`` join returned facts only; ``scores[i]`` is the
    fact's cosine with the query (traversal-added facts too)."""

    facts: tuple[Fact, ...]
    relations: tuple[Relation, ...]
    store_ids: tuple[str, ...]
    scores: tuple[float, ...] = ()
    trace: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


def retrieve(
    store: MemoryStore,
    query: str,
    *,
    k: int = 10,
    backend: str = "evomem",
    depth: int = 2,
    max_facts: int | None = None,
    query_vector: np.ndarray | None = None,
    llm: ChatJSON | None = None,
    clag: ClagConfig | None = None,
    memsearch_config: MemSearchConfig | None = None,
) -> Retrieved:
    """Facts and relational state for ``query``; see the module docstring. ``max_facts`` caps the traversal and
    the memsearch path (default ``3 * k``); ``query_vector`` skips embedding the query (it must come from the store's
    embedder). ``llm`` (an OpenAI-compatible endpoint) makes CLAG's routing, profiles and cluster choice and
    MemSearch-o1's fragment extraction and sub-queries LLM decisions; without it both use their rule-based versions
    (labelled in ``trace``). ``clag`` / ``memsearch_config``: their settings (defaults: the papers' released code)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {list(BACKENDS)}")
    vec = store.embed_query(query) if query_vector is None else query_vector
    limit = max_facts if max_facts is not None else 3 * k
    trace: dict[str, Any] = {"backend": backend}
    if backend == "clag":
        order, trace = clag_memory(store, clag, llm).search(query, vec, k)
    elif backend == "memsearch":
        order, trace = memsearch(store, query, k=k, config=memsearch_config, llm=llm, question_vector=vec)
        order = order[:limit]
    else:
        order = [ref for ref, _ in store.nearest(vec, k)]
        if backend == "evomem":
            order = _traverse(store, order, depth, limit)
    stored = store.facts(order)
    if not stored:
        return Retrieved((), (), (), (), trace)
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
    if backend != "naive":
        edges = dict.fromkeys(e for f in stored for e in store.links(f.id) if e[0] in fid and e[2] in fid)
        relations = tuple(Relation(fid[s], t, fid[d]) for s, t, d in edges)
    scores = store.similarity([f.id for f in stored], vec)
    return Retrieved(facts, relations, tuple(f.id for f in stored), tuple(scores), trace)


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
