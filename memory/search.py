"""Search over a memory store: exact dense nearest neighbours over the in-memory embedding matrix, BM25 over the
FTS5 index, and their fusion by reciprocal rank. Mixed into ``MemoryStore`` (``memory.store``), which keeps the
connection and the index this reads.

For retrieval the embeddings live in one numpy matrix, loaded when the store opens and extended after each
ingest (or when another process has committed more). Search is exact: one pass over 100k × 384 float32 is
memory-bound, ~7.5 ms on one core of this 2-core machine and ~5 ms split across both (``_scores``;
``benchmarks/bench_memory.py``). An approximate index (HNSW) would answer in under a millisecond, but on the
benchmark's vectors it finds only 94% of the true top 10 at ~1 ms, and it would be a second, derived file to keep
consistent with the store. ``hybrid`` fuses that dense ranking with the FTS5 one (``lexical``) by reciprocal rank;
the query's vector leaves out the speakers' names (``embed_query``), which the lexical side matches.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from memstate.memory.dates import DateSpan
from memstate.memory.embed import normalize
from memstate.memory.records import fact_id, fact_num

_SPLIT_SCAN_ROWS = 50_000  # below this one thread's scan beats handing half to another
HYBRID_POOL = 50  # dense and lexical candidates fused per query
RRF_K = 10  # reciprocal rank fusion's constant: small, since only the first few ranks of each list matter
# A query is embedded and matched by its first MAX_QUERY_CHARS characters (an embedder reads a few hundred tokens
# anyway: MiniLM 256); `memstate memory ask` refuses a longer question outright (docs/memory.md).
MAX_QUERY_CHARS = 4000
# Words that say what kind of question it is, not what it is about: left out of lexical queries, where each
# matching one would pull in every fact that uses it.
_STOPWORDS = frozenset(
    "a about after all also am an and any are as at be been before being both but by can could did do does doing "
    "during each for from had has have having he her here hers him his how i if in into is it its just me might "
    "more most my no nor not now of off on once only or other our ours out over own same she should so some such "
    "than that the their theirs them then there these they this those through to too under until up very was we "
    "were what when where which while who whom why will with would you your yours".split()
)


def match_query(text: str) -> str | None:
    """An FTS5 query for ``text``: its words (question words and other stop words left out) joined by OR, each quoted
    so that no word is read as FTS5 syntax; None when no word is left.

    >>> match_query('When did Caroline go to the "LGBTQ" support group?')
    '"caroline" OR "go" OR "lgbtq" OR "support" OR "group"'
    >>> match_query("What is it?") is None
    True
    """
    words = dict.fromkeys(w for w in re.findall(r"\w+", text.lower()) if w not in _STOPWORDS and len(w) > 1)
    return " OR ".join(f'"{w}"' for w in words) or None


def without_names(text: str, names: Iterable[str]) -> str:
    """``text`` with each of ``names`` (and its possessive) removed; ``text`` itself if nothing else would be left.

    >>> without_names("What did Caroline's friend research?", ["Caroline", "Mel"])
    'What did friend research?'
    """
    out = text
    for name in names:
        out = re.sub(rf"\b{re.escape(name)}(?:'s)?\b\s*", "", out, flags=re.IGNORECASE)
    return out if re.search(r"\w", out) else text


class SearchMixin:
    """``MemoryStore``'s search methods; they read its ``_db``, ``_index`` and ``embedder`` and call its ``_sync``."""

    def speakers(self) -> list[str]:
        """The names of the people whose turns the facts come from (sorted)."""
        self._sync()
        return sorted(self._index.speakers)

    def embed_query(self, text: str) -> np.ndarray:
        """The query's vector, with the speakers' names left out: a small embedder weighs a name over what is asked
        ("What did Caroline research?" finds "Wow, Caroline!"), and names are matched by the lexical index. Only the
        first ``MAX_QUERY_CHARS`` characters count."""
        self._sync()
        return self.embedder.encode([without_names(text[:MAX_QUERY_CHARS], self._index.speakers)])[0]

    def lexical(self, text: str, k: int) -> list[tuple[str, float]]:
        """The ``k`` facts that best match ``text``'s words by BM25 (SQLite FTS5, ``match_query``), best first,
        with their BM25 scores (higher is better). Only the first ``MAX_QUERY_CHARS`` characters count."""
        query = match_query(text[:MAX_QUERY_CHARS])
        if query is None or k <= 0:
            return []
        # Only facts the index has loaded: another process may commit between this store's last sync and this query,
        # and a fact the index does not know would be a KeyError downstream (tests/test_memory_concurrent.py).
        rows = self._db.execute(
            "SELECT rowid, bm25(facts_fts) FROM facts_fts WHERE facts_fts MATCH ? AND rowid <= ? "
            "ORDER BY rank, rowid DESC LIMIT ?",
            (query, self._index.last_fact, k),
        )
        return [(fact_id(num), -score) for num, score in rows]

    def hybrid(
        self,
        text: str,
        vector: np.ndarray,
        k: int,
        *,
        pool: int = HYBRID_POOL,
        rrf_k: int = RRF_K,
        span: DateSpan | None = None,
        lexical: list[str] | None = None,
    ) -> list[str]:
        """The ``k`` best facts by reciprocal rank fusion of the ``pool`` nearest by ``vector`` and the ``pool`` best
        lexical matches of ``text``: ``sum 1 / (rrf_k + rank)`` over the two lists, best first (ties: dense first).
        Dense search misses the rare words, names and dates that decide many questions; BM25 misses paraphrase.
        ``span`` (the dates a question names, ``memory.dates.question_span``): a third list, the ``pool`` nearest
        among the facts said within it. ``lexical``: that list when the caller has it already (a second search of the
        same text)."""
        scores = self._dense_scores(vector)
        dense = self._top(scores, max(pool, k))
        if lexical is None:
            lexical = [ref for ref, _ in self.lexical(text, max(pool, k))]
        rankings = [dense, lexical]
        if span is not None and scores is not None:
            idx = self._index
            rankings.append(self._top(scores, max(pool, k), span.mask(idx.days[: idx.n], idx.months[: idx.n])))
        return rrf(rankings, rrf_k)[:k]

    def nearest(self, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        """The ``k`` facts most similar to ``vector`` (unit-normalized), best first, with their cosines."""
        scores = self._dense_scores(vector)
        if scores is None or k <= 0:
            return []
        idx = self._index
        top = self._top_rows(scores, k)
        return [(fact_id(int(idx.nums[i])), float(scores[i])) for i in top]

    def _dense_scores(self, vector: np.ndarray) -> np.ndarray | None:
        """Cosine of every indexed fact with ``vector`` (None for an empty store)."""
        self._sync()
        idx = self._index
        if not idx.n:
            return None
        q = normalize(np.asarray(vector, dtype=np.float32).reshape(1, -1))[0]
        return _scores(idx.matrix[: idx.n], q)

    def _top_rows(self, scores: np.ndarray, k: int, mask: np.ndarray | None = None) -> np.ndarray:
        """Rows of the ``k`` best ``scores`` (among ``mask``), best first; ties: the later fact first."""
        idx = self._index
        rows = None if mask is None else np.flatnonzero(mask)
        sub = scores if rows is None else scores[rows]
        n, k = len(sub), min(k, len(sub))
        if k <= 0:
            return np.zeros(0, dtype=np.int64)
        top = np.argpartition(sub, n - k)[n - k :] if k < n else np.arange(n)
        top = top if rows is None else rows[top]
        return top[np.lexsort((-idx.nums[top], -scores[top]))]

    def _top(self, scores: np.ndarray | None, k: int, mask: np.ndarray | None = None) -> list[str]:
        if scores is None:
            return []
        return [fact_id(int(self._index.nums[i])) for i in self._top_rows(scores, k, mask)]

    def index_view(self) -> tuple[np.ndarray, np.ndarray]:
        """``(nums, matrix)`` of every fact in the index, oldest first (read-only views: row i is fact nums[i])."""
        self._sync()
        idx = self._index
        if not idx.n:
            return np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.float32)
        nums, matrix = idx.nums[: idx.n], idx.matrix[: idx.n]
        nums.flags.writeable = matrix.flags.writeable = False
        return nums, matrix

    def rows_of(self, nums: Sequence[int]) -> np.ndarray:
        """Row of each fact number in ``index_view()``'s matrix."""
        row = self._index.row
        return np.fromiter((row[int(n)] for n in nums), dtype=np.int64, count=len(nums))

    def vectors(self, ids: Sequence[str]) -> np.ndarray:
        """The index vectors of the stored facts ``ids``, one row each."""
        self._sync()
        idx = self._index
        return idx.matrix[[idx.row[fact_num(i)] for i in ids]]

    def similarity(self, ids: Sequence[str], vector: np.ndarray) -> list[float]:
        """Cosine of each stored fact in ``ids`` with ``vector``."""
        idx = self._index
        rows = [idx.row[fact_num(i)] for i in ids]
        q = normalize(np.asarray(vector, dtype=np.float32).reshape(1, -1))[0]
        return [float(x) for x in idx.matrix[rows] @ q] if rows else []


def rrf(rankings: Sequence[Sequence[str]], k: int = RRF_K) -> list[str]:
    """Reciprocal rank fusion: ids by ``sum 1 / (k + rank)`` over the rankings they appear in (rank from 1); ties
    keep the order of first appearance (earlier rankings first).

    >>> rrf([["a", "b", "c"], ["c", "b"]])
    ['c', 'b', 'a']
    """
    score: dict[str, float] = {}
    for ranking in rankings:
        for rank, ref in enumerate(ranking, 1):
            score[ref] = score.get(ref, 0.0) + 1.0 / (k + rank)
    return sorted(score, key=lambda ref: -score[ref])


def _scores(matrix: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``matrix @ q``. einsum's SIMD loop, without waking BLAS's threads (on a busy 2-core machine 12 ms instead of
    16 ms at 100k facts, 0.7 ms instead of 4 ms at 10k). The scan is memory-bound, and one core's bandwidth is the
    limit: a large matrix is split in two halves scanned at once (einsum releases the GIL), 7.5 → 4.8 ms at 100k."""
    n = len(matrix)
    if n < _SPLIT_SCAN_ROWS or (os.cpu_count() or 1) < 2:
        return np.einsum("ij,j->i", matrix, q)
    out = np.empty(n, dtype=np.float32)
    half = n // 2
    other = _scan_pool().submit(np.einsum, "ij,j->i", matrix[:half], q, out=out[:half])
    np.einsum("ij,j->i", matrix[half:], q, out=out[half:])
    other.result()
    return out


@functools.cache
def _scan_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(1, thread_name_prefix="memstate-scan")
