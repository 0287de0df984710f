"""MemSearch-o1 over the memory store: seeds → fragments → one scored path of facts.

MemSearch-o1 (Zhang et al.: "MemSearch-o1: Empowering Large Language Models with Reasoning-Aligned Memory Growth in
Agentic Search", ACL 2026, arXiv 2604.17265; code: github.com/Applied-Machine-Learning-Lab/ACL2026_MemSearch-o1,
read at commit 9c8f282bcd76 — ``memory_adv.py``, ``bge.py``, ``mem_o1_adv.py``) grows fine-grained memory fragments
from "memory seeds" of the query over several retrieval rounds, scores every fragment with a contribution function
and hands the answerer a greedily chained path of fragments instead of everything retrieved.

**Here** (``memsearch``; ``retrieve(store, q, backend="memsearch")``):

1. *Seeds* of the question: noun chunks, verb lemmas, date expressions (``memory.seeds``; which spaCy pipeline made
   them is ``trace["seed_pipeline"]``).
2. *Rounds* (``rounds``, default 3): round 1 searches the store for the question (hybrid top-``k``: dense and BM25
   fused, ``MemoryStore.hybrid``); each fragment is grown per seed from the retrieved facts — with an LLM endpoint, the
   LLM copies, per seed, the content useful for the question *verbatim* from one retrieved memory (a fragment whose
   content is not in that memory, or in any retrieved one, is dropped and counted); without one, the *extractive
   fallback* takes every sentence of a retrieved fact that contains the seed (its head lemma, its lemma, or the date).
   The next round's sub-query is written by the LLM (what is still missing; empty: stop) or, without one, is the
   seeds that grew no fragment yet (none left: stop).
3. *Scoring* after the last round, over all fragments i with unit embeddings f_i (the store's embedder):
   rel_i = max cosine of f_i to the question and every sub-query; w_j = max(rel_j − τ, 0);
   BP_i = Σ_{j≠i} w_j cos(f_i, f_j) / Σ_{j≠i} w_j (0 when the weights sum to 0);
   C_i = α·rel_i + β·BP_i, with α 0.6, β 0.4, τ 0.3 (``contribution``).
4. *Path*: start at the question's embedding; repeatedly take the unvisited fragment maximising
   C_i · exp(−λ(1 − cos(prev, i))), λ 1, and move there; at most ``max_fragments`` (K, default 15) steps
   (``greedy_path``).
5. The facts the path's fragments come from, in path order (de-duplicated), are the retrieved facts; the stored
   relations among them come along as for the other backends. No fragment at all: the round-1 hybrid hits
   (``trace["fallback"] = "dense"``), as the released code falls back to plain retrieval. ``trace`` lists seeds,
   sub-queries, every fragment with rel / BP / C, and the path.

**Paper vs released code vs here.** The paper's method section could not be read from here (only its abstract:
"grows fine-grained memory fragments from memory seed tokens from the queries, then retraces and deeply refines the
memory via a contribution function, and finally reorganizes a globally connected memory path"); the scoring
follows the formulas given in this project's issue for the paper (above), which are also what ``bge.py:route``
computes. Where the released code differs:

- ``route`` computes rel over the search sub-queries and the question, w = clamp(rel − 0.3, 0), BP normalised by the
  weights of the *other* fragments, C = 0.6·rel + 0.4·BP, the greedy score C·exp(−1·(1 − cont)) and K = 15, all
  hard-coded — as here. But ``mem_o1_adv.py`` calls ``route`` only when the memory has more than 30 lines, and its
  final ``if len(source) < 10 … else: source = compressed_memory`` then discards the path and answers from the whole
  concatenated memory; here the path *is* the result.
- Seeds come from each *search sub-query* in the code (``process_new_text(result, search_query)``), from the
  question here (the sub-queries only steer retrieval); the code's fragments are the LLM's ``entity: content`` lines,
  free text; here JSON with the source memory named, and verbatim-ness is checked (the code only asks for it).
- The code's rounds are the reasoning model's ``<|begin_search_query|>`` calls (≤ 5) over 256-token chunks of a long
  context with BGE-M3 top-10; here the store's facts with its embedder and ``rounds`` rounds, sub-queries as above.
- The code rebuilds the fragment pool per round (``self.memory_pool = response1``) but accumulates the text
  (``compressed_memory += memory``); here fragments accumulate and are de-duplicated.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from memstate.memory.backends import Backend, Query, register
from memstate.memory.embed import normalize
from memstate.memory.llm_client import ChatJSON, LLMError
from memstate.memory.records import fact_num
from memstate.memory.rule_extractor import sentences
from memstate.memory.seeds import Seed, SeedExtractor, default_seed_extractor, seed_matches
from memstate.memory.store import MemoryStore

MEMSEARCH_PROMPT_VERSION = "ms-memsearch-v1"


@dataclass(frozen=True)
class MemSearchConfig:
    """``rounds`` retrieval rounds; contribution weights α, β and threshold τ; smoothness λ; path length K."""

    rounds: int = 3
    alpha: float = 0.6
    beta: float = 0.4
    tau: float = 0.3
    lam: float = 1.0
    max_fragments: int = 15
    max_seeds: int = 15

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.max_fragments < 1:
            raise ValueError("rounds and max_fragments must be ≥ 1")


@dataclass(frozen=True)
class Fragment:
    """A piece of a retrieved fact, grown from ``seed`` in round ``round`` (``via`` llm or extractive)."""

    seed: str
    text: str
    source: str
    round: int
    via: str


@dataclass(frozen=True)
class Contribution:
    rel: np.ndarray
    bp: np.ndarray
    c: np.ndarray


def contribution(
    fragments: np.ndarray, queries: np.ndarray, *, alpha: float = 0.6, beta: float = 0.4, tau: float = 0.3
) -> Contribution:
    """rel, BP and C = α·rel + β·BP for unit fragment vectors (rows) against unit query vectors (question and
    sub-queries); see the module docstring.

    >>> f = np.array([[1.0, 0.0], [0.6, 0.8]]); q = np.array([[1.0, 0.0]])
    >>> s = contribution(f, q)
    >>> s.rel.round(3).tolist(), s.bp.round(3).tolist(), s.c.round(3).tolist()
    ([1.0, 0.6], [0.6, 0.6], [0.84, 0.6])
    """
    f = np.asarray(fragments, dtype=np.float64)
    rel = (f @ np.asarray(queries, dtype=np.float64).T).max(axis=1)
    sim = f @ f.T
    np.fill_diagonal(sim, 0.0)
    w = np.maximum(rel - tau, 0.0)
    total = w.sum() - w  # weights of the other fragments
    bp = np.divide(sim @ w, total, out=np.zeros_like(rel), where=total > 0)
    return Contribution(rel, bp, alpha * rel + beta * bp)


def greedy_path(fragments: np.ndarray, c: np.ndarray, start: np.ndarray, *, k: int = 15, lam: float = 1.0) -> list[int]:
    """Indices of at most ``k`` fragments: from ``start`` (the question), each step takes the unvisited fragment
    maximising C_i · exp(−λ(1 − cos(prev, i))) (ties: the lower index) and moves there.

    >>> greedy_path(np.array([[0.0, 1.0], [1.0, 0.0]]), np.array([0.9, 0.5]), np.array([1.0, 0.0]))
    [1, 0]
    """
    f = np.asarray(fragments, dtype=np.float64)
    current = np.asarray(start, dtype=np.float64)
    left = list(range(len(f)))
    path: list[int] = []
    while left and len(path) < k:
        scores = [float(c[i]) * math.exp(-lam * (1.0 - float(current @ f[i]))) for i in left]
        best = left[int(np.argmax(scores))]
        path.append(best)
        left.remove(best)
        current = f[best]
    return path


def extractive_fragments(
    seeds: list[Seed], facts: list[tuple[str, str]], rnd: int, extractor: SeedExtractor
) -> list[Fragment]:
    """Without an LLM: every sentence of a retrieved fact ``(id, text)`` that holds a seed is a fragment of it."""
    out = []
    for ref, text in facts:
        for sentence in sentences(text) or [text]:
            lemmas, lower = extractor.lemmas(sentence), sentence.lower()
            for seed in seeds:
                if seed_matches(seed, lemmas, lower):
                    out.append(Fragment(seed.text, sentence, ref, rnd, "extractive"))
    return out


def _norm_space(text: str) -> str:
    return " ".join(text.split()).lower()


_SYSTEM = "You help a personal assistant search its long-term memories about its user. Reply with JSON only."


def llm_fragments(
    llm: ChatJSON, question: str, query: str, seeds: list[Seed], facts: list[tuple[str, str]], rnd: int
) -> tuple[list[Fragment], int]:
    """Fragments the LLM copies verbatim per seed from the retrieved facts; returns them and how many it gave that
    were not verbatim (dropped)."""
    listed = "\n".join(f"[{ref}] {text}" for ref, text in facts)
    user = (f"Question: {question}\nSearch: {query}\nSeeds (entities, actions, times): "
            f"{', '.join(s.text for s in seeds)}\n\nRetrieved memories:\n{listed}\n\nFor each seed, copy from the "
            "retrieved memories the content that is useful for answering the question, word for word — never in "
            "your own words — and name the memory it comes from. Skip a seed when nothing useful is there. Reply "
            'with JSON: {"fragments": [{"seed": "...", "memory": "<memory id>", "content": "..."}]}.')  # fmt: skip
    schema = {"type": "object", "additionalProperties": False, "required": ["fragments"], "properties": {
        "fragments": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["seed", "memory", "content"],
            "properties": {"seed": {"type": "string"}, "memory": {"type": "string"},
                           "content": {"type": "string", "minLength": 1}}}}}}  # fmt: skip
    messages = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]
    reply = llm.ask(messages, schema, "memsearch_grow")
    texts = dict(facts)
    out, rejected = [], 0
    for item in reply["fragments"]:
        content = item["content"].strip()
        named = item["memory"] if item["memory"] in texts else None
        sources = ([named] if named else []) + [r for r in texts if r != named]
        source = next((r for r in sources if _norm_space(content) in _norm_space(texts[r])), None)
        if source is None:
            rejected += 1
            continue
        out.append(Fragment(item["seed"].strip() or "?", content, source, rnd, "llm"))
    return out, rejected


def llm_next_query(llm: ChatJSON, question: str, fragments: list[Fragment], asked: list[str]) -> str:
    """The LLM's next search query for what is still missing ("" = nothing is)."""
    held = "\n".join(f"- {f.seed}: {f.text}" for f in fragments) or "(nothing yet)"
    user = (f"Question: {question}\nSearches so far: {'; '.join(asked)}\nWhat the memory search found:\n{held}\n\n"
            "Write one short search query for information still missing to answer the question, or an empty "
            'string if nothing is missing. Reply with JSON: {"query": "..."}.')  # fmt: skip
    schema = {"type": "object", "additionalProperties": False, "required": ["query"],
              "properties": {"query": {"type": "string"}}}  # fmt: skip
    return llm.ask([{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}], schema,
                   "memsearch_query")["query"].strip()  # fmt: skip


def memsearch(
    store: MemoryStore,
    question: str,
    *,
    k: int = 10,
    config: MemSearchConfig | None = None,
    llm: ChatJSON | None = None,
    question_vector: np.ndarray | None = None,
    seed_extractor: SeedExtractor | None = None,
) -> tuple[list[str], dict[str, Any]]:
    """Fact ids in path order and a trace; see the module docstring."""
    config = config or MemSearchConfig()
    extractor = seed_extractor or default_seed_extractor()
    seeds = extractor(question)[: config.max_seeds]
    qvec = normalize(np.asarray(store.embed_query(question) if question_vector is None else question_vector,
                                dtype=np.float32).reshape(1, -1))[0]  # fmt: skip
    trace: dict[str, Any] = {
        "backend": "memsearch",
        "seed_pipeline": extractor.name,
        "extractor": "llm" if llm is not None else "extractive",
        "config": asdict(config),
        "seeds": [[s.text, s.kind] for s in seeds],
        "fallback": None,
    }
    sub_queries, query_vecs = [question], [qvec]
    fragments: list[Fragment] = []
    seen: set[tuple[str, str]] = set()
    covered: set[str] = set()
    first_hits: list[str] = []
    rejected = llm_failures = 0
    for rnd in range(1, config.rounds + 1):
        hits = store.hybrid(sub_queries[-1], query_vecs[-1], k)
        if rnd == 1:
            first_hits = hits
        facts = [(f.id, f.text) for f in store.facts(hits)]
        grown: list[Fragment] | None = None
        if llm is not None and seeds and facts:
            try:
                grown, bad = llm_fragments(llm, question, sub_queries[-1], seeds, facts, rnd)
                rejected += bad
            except LLMError:
                llm_failures += 1
        if grown is None:
            grown = extractive_fragments(seeds, facts, rnd, extractor)
            if llm is not None:
                grown = [Fragment(f.seed, f.text, f.source, f.round, "extractive (llm failed)") for f in grown]
        covered.update(f.seed.lower() for f in grown)
        for f in grown:
            if (f.source, f.text) not in seen:
                seen.add((f.source, f.text))
                fragments.append(f)
        if rnd == config.rounds:
            break
        nxt = ""
        if llm is not None:
            try:
                nxt = llm_next_query(llm, question, fragments, sub_queries)
            except LLMError:
                llm_failures += 1
                nxt = None  # type: ignore[assignment]
        if llm is None or nxt is None:
            nxt = " ".join(s.text for s in seeds if s.text.lower() not in covered)
        if not nxt or nxt in sub_queries:
            break
        sub_queries.append(nxt)
        query_vecs.append(store.embed_query(nxt))
    trace["sub_queries"] = sub_queries
    trace["rejected_fragments"] = rejected
    trace["llm_failures"] = llm_failures
    if not fragments:
        trace["fallback"] = "dense"
        trace["fragments"], trace["path"] = [], []
        return first_hits, trace
    fvecs = _fragment_vectors(store, fragments)
    scores = contribution(fvecs, normalize(np.stack(query_vecs)), alpha=config.alpha, beta=config.beta, tau=config.tau)
    path = greedy_path(fvecs, scores.c, qvec, k=config.max_fragments, lam=config.lam)
    trace["fragments"] = [
        {**asdict(f), "rel": round(float(scores.rel[i]), 4), "bp": round(float(scores.bp[i]), 4),
         "c": round(float(scores.c[i]), 4)}
        for i, f in enumerate(fragments)
    ]  # fmt: skip
    trace["path"] = path
    return list(dict.fromkeys(fragments[i].source for i in path)), trace


def _fragment_vectors(store: MemoryStore, fragments: list[Fragment]) -> np.ndarray:
    """Unit vectors of the fragments: a fragment that is its whole fact reuses the stored vector."""
    nums = [fact_num(f.source) for f in fragments]
    whole = store.texts([n for n in nums if n is not None])
    todo = [i for i, (f, n) in enumerate(zip(fragments, nums, strict=True)) if whole.get(n, "").strip() != f.text]
    skip = set(todo)
    reuse = [i for i in range(len(fragments)) if i not in skip]
    _, matrix = store.index_view()
    out = np.zeros((len(fragments), matrix.shape[1]), dtype=np.float32)
    if reuse:
        out[reuse] = matrix[store.rows_of([nums[i] for i in reuse])]
    if todo:
        out[todo] = store.embedder.encode([fragments[i].text for i in todo])
    return normalize(out)


def _memsearch_search(query: Query) -> tuple[list[str], dict[str, Any]]:
    return memsearch(query.store, query.text, k=query.k, config=query.settings, llm=query.llm,
                     question_vector=query.vector)  # fmt: skip


register(
    Backend(
        name="memsearch",
        summary="MemSearch-o1: query seeds grow fragments over retrieval rounds, chained into a path",
        search=_memsearch_search,
        decisions=(
            "rule-based (extractive fragments, uncovered-seed sub-queries)",
            "llm (verbatim fragments, sub-queries)",
        ),
        settings=MemSearchConfig,
        # Under a budget: its path order puts weaker facts first when it grows from many seeds. LoCoMo at 565
        # rendered tokens, hit 0.757 at 10 seeds vs 0.633 at 50, chosen in every leave-one-out fold
        # (benchmarks/budget_seeds_cv.py).
        budget_seeds=10,
    )
)
