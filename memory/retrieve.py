"""Retrieval: facts and their relational state for a query, in the Instance shapes of docs/design.md, from any
registered backend (``memstate.memory.backends``).

Built in: ``evomem`` (EvoMemState) and ``naive`` (NaiveRAG) in ``memory.evomem``; ``clag`` (CLAG, ``memory.clag``):
the store's facts routed into topic clusters, the query picks clusters (by an LLM, or by similarity to their
profiles), then the ``k`` most similar facts among their members; ``memsearch`` (MemSearch-o1, ``memory.memsearch``):
seeds of the query grow fragments over a few retrieval rounds, chained into a path whose facts come in path order.

Facts come back numbered F1..Fn in the backend's order, so a prompt truncated from the end loses the least relevant
facts. ``role`` (analysis only, never shown to a model) is ``outdated`` for a fact some stored fact supersedes,
``gold`` otherwise. ``Retrieved.trace`` says how the backend decided (clusters chosen, LLM or rule-based, seeds,
fragments and their scores, fallbacks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memstate.memory.backends import Query, get_backend
from memstate.memory.llm_client import ChatJSON
from memstate.memory.records import StoredFact
from memstate.memory.store import MemoryStore
from memstate.memory.tokens import TokenCounter, token_counter, within_budget
from memstate.prompts import format_fact
from memstate.schema import Fact, Relation


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
    settings: Any = None,
    budget_tokens: int | None = None,
    tokenizer: str | None = None,
) -> Retrieved:
    """Facts and relational state for ``query`` from ``backend`` (a registered name); see the module docstring.
    ``max_facts`` caps the facts returned (default ``3 * k``: evomem's traversal, memsearch's path); ``query_vector``
    skips embedding the query (it must come from the store's embedder). ``llm`` (an OpenAI-compatible endpoint) makes
    the decisions of backends that have LLM versions (CLAG's routing, profiles and cluster choice, MemSearch-o1's
    fragments and sub-queries); without it they use their rule-based versions (labelled in ``trace``).
    ``settings``: an instance of the backend's settings dataclass (default: its defaults). ``budget_tokens``: the
    facts are taken in the backend's order while they fit in that many tokens (``memory.tokens``), each counted as a
    prompt shows it (``memstate.prompts.format_fact``: id, attributes and text); the backend is asked for its
    ``budget_seeds`` (at least ``k``), so the budget, not ``k``, decides how many come back. ``tokenizer``: the
    directory of the tokenizer that counts (the responder's; MiniLM's WordPiece when None)."""
    spec = get_backend(backend)
    if budget_tokens is not None:
        k = max(k, spec.budget_seeds)
    vec = store.embed_query(query) if query_vector is None else query_vector
    limit = max_facts if max_facts is not None else 3 * k
    order, trace = spec.search(Query(store, query, vec, k, limit, depth, llm, settings))
    order, trace = order[:limit], {"backend": backend, **trace}
    stored = store.facts(order)
    if budget_tokens is not None:
        stored = within_rendered_budget(stored, budget_tokens, token_counter(tokenizer))
    facts = number(stored)
    if not facts:
        return Retrieved((), (), (), (), trace)
    stored = [f for f, _ in facts]
    fid = {f.id: shown.id for f, shown in facts}
    relations: tuple[Relation, ...] = ()
    if spec.relations:
        edges = dict.fromkeys(e for f in stored for e in store.links(f.id) if e[0] in fid and e[2] in fid)
        relations = tuple(Relation(fid[s], t, fid[d]) for s, t, d in edges)
    scores = store.similarity([f.id for f in stored], vec)
    return Retrieved(tuple(shown for _, shown in facts), relations, tuple(f.id for f in stored), tuple(scores), trace)


def shown_fact(fact: StoredFact, fid: str) -> Fact:
    """A stored fact as prompts show it, numbered ``fid``; ``role`` (never shown) says whether it was superseded."""
    return Fact(id=fid, text=fact.text, kind=fact.kind, scope=fact.scope, turn=fact.turn, time=fact.time,
                role="gold" if fact.current else "outdated")  # fmt: skip


def number(stored: list[StoredFact]) -> list[tuple[StoredFact, Fact]]:
    return [(f, shown_fact(f, f"F{i}")) for i, f in enumerate(stored, 1)]


def within_rendered_budget(stored: list[StoredFact], budget: int, counter: TokenCounter) -> list[StoredFact]:
    """The facts taken in order while their prompt lines (``format_fact``, numbered as they are taken, each with the
    line break after it) fit in ``budget`` tokens of ``counter`` (``memory.tokens.within_budget``)."""
    return within_budget(
        stored, lambda f, n: counter.count_text(format_fact(shown_fact(f, f"F{n}"))) + counter.newline, budget
    )
