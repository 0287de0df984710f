"""``memstate eval retrieval DATA --out DIR``: how much of a benchmark's answer evidence each memory backend retrieves,
at what cost in prompt tokens and time — against BM25 over the raw turns, and against naive dense retrieval returning
as many facts.

A benchmark question names the turns that hold its answer (LoCoMo's ``evidence`` dia_ids). Each sample is ingested
into its own store (``DIR/stores/<sample id>.sqlite``; a re-run reuses them: ingest skips sessions already stored),
then for every question, backend and ``k`` the retrieved facts are mapped to the turns they came from (a stored
fact's ``source``) and scored:

- **recall**: share of the question's evidence turns among the retrieved facts' sources; **hit**: at least one;
  **complete**: all of them. Averaged over questions.
- **tokens**: the retrieved facts as a prompt shows them (``memstate.prompts.format_fact``: ``[F1] (attributes)
  text``), newline-joined, counted by the all-MiniLM-L6-v2 WordPiece tokenizer (bert-base-uncased vocabulary, no
  special tokens): the size of the memory block a responder reads, and what a token budget counts.
  **text_tokens**: the facts' texts alone (what budgets counted before issue 57).
- **latency**: wall time of the ``retrieve`` call, query embedding included (p50, p95), one call at a time. The
  first call per store and backend (loading the model, building CLAG's clusters) is a warm-up, timed apart.
- **n_facts**: facts returned (traversal and paths may return more than ``k``; ``retrieve`` caps them at ``3k``).

``bm25_turns@k``: the ``k`` best raw turns (``"<speaker>: <text>"``, the image caption as the LoCoMo reader keeps it)
by SQLite FTS5's BM25 (porter stemming), the question as the same OR of its words that the stores' own lexical
index is asked (``memory.search.match_query``: question and stop words left out, which lifts this baseline by several
points over an OR of every token). Every report has it.

Traversal must earn its tokens: each backend other than ``naive`` is compared with ``naive`` asked, per question,
for exactly as many facts as the backend returned (``equal_facts``). All differences (backend − bm25_turns at the same
``k``; backend − naive at equal facts) are paired per question with a percentile bootstrap 95% CI
(``memstate.evaluate.stats``); questions are resampled one by one, not by conversation. Evidence coverage (the share
of evidence turns with at least one stored fact) bounds every backend's recall and is reported beside it.

Written: ``retrieval.json`` (every figure and the settings), ``retrieval.md`` (the tables), ``retrieval.png``
(recall@k with CIs; recall against tokens) and ``retrieval_questions.jsonl`` (per question and system).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from memstate.errors import ConfigError, InputError, InputNotFound
from memstate.evaluate.stats import mean_ci, paired_difference_ci
from memstate.memory.backends import backend_names, get_backend
from memstate.memory.cli import EXTRACTORS, store_name
from memstate.memory.extract import DEFAULT_EXTRACTOR, make_extractor
from memstate.memory.ingest import locomo_sessions
from memstate.memory.search import match_query
from memstate.memory.tokens import TokenCounter, token_counter, within_budget
from memstate.prompts import format_fact
from memstate.sources.locomo import LocomoSample, read_locomo
from memstate.sources.memsyco import load_memsyco

logger = logging.getLogger("memstate.evaluate.retrieval")

BM25 = "bm25_turns"
# Stores of an older format are not reused: 2 = turn labels with the day only, vectors with the fact before (issue 45).
FACT_FORMAT = 2
BM25_BUDGET_POOL = 100  # turns ranked before a budget is filled (~45 of LoCoMo's fit 565 tokens at the most)
NAIVE = "naive"
METRICS = ("recall", "hit", "complete")
# LoCoMo's categories as most follow-up work reads them (the release does not name them).
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}


# ---- scoring ---------------------------------------------------------------------------------------------------------


def score(evidence: Sequence[str], sources: Iterable[str | None]) -> dict[str, float]:
    """Recall, hit and complete of the retrieved ``sources`` against a question's ``evidence`` turn ids.

    >>> score(("D2:2", "D2:3"), ["D2:2", "D1:1", "D2:2"])
    {'recall': 0.5, 'hit': 1.0, 'complete': 0.0}
    """
    wanted = set(evidence)
    found = wanted & set(sources)
    return {"recall": len(found) / len(wanted), "hit": float(bool(found)), "complete": float(found == wanted)}


# ---- the BM25 baseline -----------------------------------------------------------------------------------------------


class TurnIndex:
    """BM25 over one sample's raw turns, ``"<speaker>: <text>"``: an in-memory SQLite FTS5 table."""

    def __init__(self, sample: LocomoSample) -> None:
        self._db = sqlite3.connect(":memory:")
        self._db.execute("CREATE VIRTUAL TABLE turns USING fts5(text, source UNINDEXED, tokenize='porter unicode61')")
        rows = [(f"{t.speaker}: {t.text}", t.dia_id) for s in sample.sessions for t in s.turns]
        self._db.executemany("INSERT INTO turns (text, source) VALUES (?, ?)", rows)

    def search(self, question: str, k: int) -> list[tuple[str, str]]:
        """The ``k`` best turns as ``(source, text)``, best first; none when the question has no word."""
        query = match_query(question)
        if query is None:
            return []
        sql = "SELECT source, text FROM turns WHERE turns MATCH ? ORDER BY bm25(turns) LIMIT ?"
        return self._db.execute(sql, (query, k)).fetchall()

    def close(self) -> None:
        self._db.close()


# ---- questions and stores --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    sample: str
    qa: int  # index in the sample's ``qa``
    text: str
    category: int
    evidence: tuple[str, ...]


def select_questions(samples: Sequence[LocomoSample], categories: Sequence[int]) -> tuple[list[Question], dict]:
    """The questions of ``categories`` with at least one valid evidence id, and counts of those left out."""
    out, skipped = [], {"other_category": 0, "no_valid_evidence": 0}
    for sample in samples:
        for i, qa in enumerate(sample.qa):
            if qa.category not in categories:
                skipped["other_category"] += 1
            elif not qa.evidence:
                skipped["no_valid_evidence"] += 1
            else:
                out.append(Question(sample.id, i, qa.question, qa.category, qa.evidence))
    return out, skipped


def _check_store_settings(store_dir: Path, settings: dict[str, Any]) -> None:
    """Stores are reused only with the extractor and fact format they were built with (the store itself checks the
    embedder)."""
    path = store_dir / "ingest.json"
    if path.is_file():
        before = json.loads(path.read_text())
        for key in ("extractor", "fact_format"):
            if before.get(key) != settings[key]:
                raise ConfigError(f"{store_dir}: stores were built with {key} {before.get(key)!r}, not "
                                  f"{settings[key]!r}: give another --out, or delete {store_dir}")  # fmt: skip
    store_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings))


# ---- measuring -------------------------------------------------------------------------------------------------------


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def _row(q: Question, sources: list[str | None], texts: list[str], ms: float, tokens: TokenCounter,
         lines: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """One system's scores on one question. ``lines``: the facts as the prompt shows them (``texts`` when None)."""
    return {
        **score(q.evidence, sources),
        "tokens": tokens(texts if lines is None else lines),
        "text_tokens": tokens(texts),
        "ms": ms,
        "n_facts": len(sources),
        "sources": sources,
    }


def _measure_sample(
    store: Any,
    sample: LocomoSample,
    questions: list[Question],
    backends: Sequence[str],
    ks: Sequence[int],
    budgets: Sequence[int],
    depth: int,
    tokens: TokenCounter,
    warmup: dict[str, float],
    bar: tqdm,
    tokenizer: str | None = None,
) -> list[dict[str, Any]]:
    """One record per question: every backend and bm25_turns at each k and token budget scored, and naive at each
    backend@k's fact count."""
    from memstate.memory.retrieve import retrieve

    facts = {f.id: f.source for f in store.facts()}
    for backend in backends:  # warm-up: model load, CLAG's clusters; timed apart from the questions
        start = time.perf_counter()
        retrieve(store, questions[0].text, k=max(ks), backend=backend)
        warmup[backend] = warmup.get(backend, 0.0) + 1000 * (time.perf_counter() - start)
    turns = TurnIndex(sample)
    cuts = [(str(k), {"k": k}) for k in ks] + [(f"{b}tok", {"budget_tokens": b}) for b in budgets]
    records = []
    for q in questions:
        rec: dict[str, Any] = {"sample": q.sample, "qa": q.qa, "question": q.text, "category": q.category,
                               "evidence": list(q.evidence), "systems": {}, "equal_facts": {}}  # fmt: skip
        naive_at: dict[int, dict[str, float]] = {0: score(q.evidence, [])}
        vector = None
        for cut, size in cuts:
            for backend in backends:
                start = time.perf_counter()
                got = retrieve(store, q.text, backend=backend, depth=depth, tokenizer=tokenizer, **size)
                ms = 1000 * (time.perf_counter() - start)
                n = len(got.store_ids)
                sources = [facts.get(i) for i in got.store_ids]
                lines = [format_fact(f) for f in got.facts]
                rec["systems"][f"{backend}@{cut}"] = _row(q, sources, [f.text for f in got.facts], ms, tokens, lines)
                if backend != NAIVE and "k" in size:  # at a budget, naive@budget is the equal-cost comparison
                    if n not in naive_at:
                        vector = store.embed_query(q.text) if vector is None else vector
                        ids = retrieve(store, q.text, k=n, backend=NAIVE, query_vector=vector).store_ids
                        naive_at[n] = score(q.evidence, [facts.get(i) for i in ids])
                    rec["equal_facts"][f"{backend}@{cut}"] = {"naive_k": n, **naive_at[n]}
            start = time.perf_counter()
            hits = _bm25_turns(turns, q.text, tokens, **size)
            ms = 1000 * (time.perf_counter() - start)
            shown = [f"[F{i}] {t}" for i, (_, t) in enumerate(hits, 1)]
            rec["systems"][f"{BM25}@{cut}"] = _row(q, [s for s, _ in hits], [t for _, t in hits], ms, tokens, shown)
        records.append(rec)
        bar.update(1)
    turns.close()
    return records


def _bm25_turns(turns: TurnIndex, question: str, tokens: TokenCounter, k: int | None = None,
                budget_tokens: int | None = None) -> list[tuple[str, str]]:  # fmt: skip
    """bm25_turns' ``k`` best turns, or its best ``BM25_BUDGET_POOL`` packed into ``budget_tokens``, each counted as
    a prompt would show it: ``[F1] <speaker>: <text>`` (the id costs what the backends' ids cost)."""
    if budget_tokens is None:
        return turns.search(question, k)
    hits = turns.search(question, BM25_BUDGET_POOL)
    return within_budget(hits, lambda hit, n: tokens.count_text(f"[F{n}] {hit[1]}") + tokens.newline, budget_tokens)


def _coverage(stored: dict[str, set[str | None]], questions: list[Question]) -> dict[str, Any]:
    """Share of the evaluated questions' evidence turns (unique per sample) that have at least one stored fact."""
    turns = sorted({(q.sample, e) for q in questions for e in q.evidence})
    missing = [f"{s}:{e}" for s, e in turns if e not in stored[s]]
    mentions = [(q.sample, e) for q in questions for e in q.evidence]
    return {
        "evidence_turns": len(turns),
        "with_fact": len(turns) - len(missing),
        "fraction": (len(turns) - len(missing)) / len(turns) if turns else None,
        "evidence_mentions": len(mentions),
        "mentions_with_fact": sum(e in stored[s] for s, e in mentions),
        "missing": missing,
    }


def summarize(records: list[dict[str, Any]], systems: list[str], backends: Sequence[str], ks: Sequence[int],
              budgets: Sequence[int] = (), n_resamples: int = 2000) -> dict[str, Any]:  # fmt: skip
    """``results``, ``per_category`` and ``comparisons`` (paired per question) from the per-question records."""
    results: dict[str, Any] = {}
    for name in systems:
        rows = [r["systems"][name] for r in records]
        ms = [x["ms"] for x in rows]
        recall_ci = mean_ci([x["recall"] for x in rows], n_resamples=n_resamples)
        hit_ci = mean_ci([x["hit"] for x in rows], n_resamples=n_resamples)
        results[name] = {
            **{m: float(np.mean([x[m] for x in rows])) for m in METRICS},
            "tokens": float(np.mean([x["tokens"] for x in rows])),
            "text_tokens": float(np.mean([x.get("text_tokens", x["tokens"]) for x in rows])),
            "p50_ms": _percentile(ms, 50),
            "p95_ms": _percentile(ms, 95),
            "n_facts": float(np.mean([x["n_facts"] for x in rows])),
            "n": len(rows),
            "recall_ci95": [recall_ci.low, recall_ci.high] if recall_ci else None,
            "hit_ci95": [hit_ci.low, hit_ci.high] if hit_ci else None,
        }
    per_category: dict[str, Any] = {}
    for cat in sorted({r["category"] for r in records}):
        rows = [r for r in records if r["category"] == cat]
        per_category[str(cat)] = {
            "name": CATEGORY_NAMES.get(cat),
            "n": len(rows),
            "results": {s: {m: float(np.mean([r["systems"][s][m] for r in rows])) for m in METRICS} for s in systems},
        }
    comparisons: dict[str, Any] = {}
    for k in ks:
        base = [r["systems"][f"{BM25}@{k}"] for r in records]
        for backend in backends:
            name = f"{backend}@{k}"
            rows = [r["systems"][name] for r in records]
            entry: dict[str, Any] = {}
            for m in ("recall", "hit"):
                ci = paired_difference_ci([x[m] for x in rows], [x[m] for x in base], n_resamples=n_resamples)
                entry[f"{m}_vs_{BM25}"] = ci.as_dict() if ci else None
            if backend != NAIVE:
                eq = [r["equal_facts"][name] for r in records]
                entry["equal_facts"] = {"n_facts": float(np.mean([x["naive_k"] for x in eq]))}
                for m in ("recall", "hit"):
                    ci = paired_difference_ci([x[m] for x in rows], [x[m] for x in eq], n_resamples=n_resamples)
                    entry["equal_facts"][f"naive_{m}"] = float(np.mean([x[m] for x in eq]))
                    entry["equal_facts"][f"{m}_diff"] = ci.as_dict() if ci else None
            comparisons[name] = entry
    for budget in budgets:  # at the same budget: against bm25_turns, and (where it ran) naive
        cut = f"{budget}tok"
        for backend in backends:
            name = f"{backend}@{cut}"
            entry = {}
            for other in (BM25, NAIVE) if backend != NAIVE and NAIVE in backends else (BM25,):
                for m in ("recall", "hit"):
                    ci = paired_difference_ci([r["systems"][name][m] for r in records],
                                              [r["systems"][f"{other}@{cut}"][m] for r in records],
                                              n_resamples=n_resamples)  # fmt: skip
                    entry[f"{m}_vs_{other}"] = ci.as_dict() if ci else None
            comparisons[name] = entry
    return {"results": results, "per_category": per_category, "comparisons": comparisons}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def evaluate_retrieval(
    data_path: str | Path,
    out_dir: str | Path,
    *,
    backends: Sequence[str] | None = None,
    ks: Sequence[int] = (5, 10, 20),
    budgets: Sequence[int] = (565,),
    depth: int = 2,
    categories: Sequence[int] = (1, 2, 3, 4),
    extractor: str = "turns",
    extractor_url: str | None = None,
    extractor_model: str | None = None,
    embedder: str | None = None,
    n_resamples: int = 2000,
    tokenizer: str | None = None,
) -> dict[str, Any]:
    """Ingest every sample of a LoCoMo file into ``out_dir/stores`` and measure retrieval (module docstring); the
    returned dict is ``retrieval.json``'s content plus ``questions`` (the per-question records)."""
    from memstate.memory.embed import embedder_from_name
    from memstate.memory.store import MemoryStore

    backends = list(dict.fromkeys(b for b in (backends or backend_names()) if b != BM25))
    for name in backends:
        get_backend(name)  # ConfigError naming the known ones
    ks = sorted(set(ks))
    if not ks or ks[0] < 1:
        raise ConfigError(f"--k: every k must be at least 1, got {ks}")
    budgets = sorted(set(budgets))
    if budgets and budgets[0] < 1:
        raise ConfigError(f"--budget: every budget must be at least 1 token, got {budgets}")
    if not categories or not set(categories) <= set(CATEGORY_NAMES):
        raise ConfigError(f"--categories: each must be one of 1..5, got {list(categories)}")
    data_path = Path(data_path)
    if not data_path.is_file():
        raise InputNotFound(f"{data_path}: no such benchmark file")
    data = read_locomo(data_path)
    for skipped in data.skipped:
        logger.warning("skipped %s", skipped)
    questions, left_out = select_questions(data.samples, categories)
    if not questions:
        raise InputError(f"{data_path}: no question of categories {list(categories)} has a valid evidence id")
    ingest_settings = {"extractor": extractor, "extractor_model": extractor_model, "embedder": embedder,
                       "fact_format": FACT_FORMAT}  # fmt: skip
    the_extractor = make_extractor(extractor, extractor_url, extractor_model)
    the_embedder = embedder_from_name(embedder) if embedder else None
    store_dir = Path(out_dir) / "stores"
    _check_store_settings(store_dir, ingest_settings)

    by_sample = {s.id: [q for q in questions if q.sample == s.id] for s in data.samples}
    tokens = token_counter(tokenizer)
    stored: dict[str, set[str | None]] = {}
    records: list[dict[str, Any]] = []
    warmup: dict[str, float] = {}
    embedder_name = None
    bar = tqdm(total=len(questions), desc="retrieval", unit="question")
    for sample in data.samples:
        with MemoryStore(store_dir / store_name(sample.id), the_embedder) as store:
            start = time.perf_counter()
            reports = store.ingest(locomo_sessions(sample), the_extractor)
            new = [r for r in reports if r.status != "duplicate"]
            logger.info("%s: %d sessions ingested (%d already stored), %d facts in the store (%.1f s)", sample.id,
                        len(new), len(reports) - len(new), len(store), time.perf_counter() - start)  # fmt: skip
            for r in new:
                for rejected in r.rejected:
                    logger.warning("%s session %s: rejected %s", sample.id, r.session_id, rejected)
            embedder_name = store.embedder.name
            stored[sample.id] = {f.source for f in store.facts()}
            if by_sample[sample.id]:
                records += _measure_sample(store, sample, by_sample[sample.id], backends, ks, budgets, depth, tokens,
                                           warmup, bar, tokenizer)  # fmt: skip
    bar.close()

    cuts = [*map(str, ks), *(f"{b}tok" for b in budgets)]
    systems = [f"{s}@{cut}" for cut in cuts for s in (*backends, BM25)]
    result = summarize(records, systems, backends, ks, budgets, n_resamples)
    result["coverage"] = {**_coverage(stored, questions), "broken_evidence_ids": len(data.skipped)}
    result["data"] = {
        "path": str(data_path),
        "sha256": _sha256(data_path),
        "format": "locomo",
        "samples": len(data.samples),
        "questions": sum(len(s.qa) for s in data.samples),
        "evaluated": len(questions),
        "skipped": {**left_out, "broken_evidence_ids": len(data.skipped)},
        "broken_evidence_ids": list(data.skipped),
    }
    result["settings"] = {
        "backends": backends,
        "ks": ks,
        "budgets_tokens": list(budgets),
        "depth": depth,
        "budget": "facts taken in the backend's order while their prompt lines (memstate.prompts.format_fact) fit "
        "(memory.retrieve.within_rendered_budget); each backend asked for its budget_seeds "
        f"({ {b: get_backend(b).budget_seeds for b in backends} }); bm25_turns: its best {BM25_BUDGET_POOL} turns "
        "packed the same way, each counted as '[Fi] <speaker>: <text>'",
        "categories": list(categories),
        "extractor": extractor,
        "extractor_model": extractor_model,
        "embedder": embedder_name,
        "tokenizer": tokens.name,
        "max_facts": "3 * k (retrieve's default)",
        "decisions": {b: get_backend(b).decisions[0] for b in backends},
        "bootstrap_resamples": n_resamples,
        "bootstrap": "paired percentile bootstrap over questions (not clustered by conversation)",
        "latency": "wall ms of retrieve() incl. query embedding, sequential; bm25_turns: the FTS5 query",
        "warmup_ms": warmup,
        "stores": str(store_dir),
    }
    result["questions"] = records
    return result


# ---- the report ------------------------------------------------------------------------------------------------------


def _f(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _d(ci: dict | None) -> str:
    if not ci:
        return "–"
    low, high = ci["ci95"]
    return f"{ci['mean']:+.3f} [{low:+.3f}, {high:+.3f}]"


def render_markdown(result: dict[str, Any]) -> str:
    d, s, cov = result["data"], result["settings"], result["coverage"]
    res, comp = result["results"], result["comparisons"]
    skipped = d["skipped"]
    lines = [
        "# Retrieval of answer evidence",
        "",
        f"- data: `{d['path']}` (sha256 `{d['sha256'][:12]}`): {d['samples']} conversations, {d['questions']} "
        f"questions; evaluated {d['evaluated']} (categories {s['categories']}); left out: {skipped['other_category']} "
        f"of other categories, {skipped['no_valid_evidence']} without a valid evidence id; "
        f"{skipped['broken_evidence_ids']} broken evidence ids skipped (listed in retrieval.json)",
        f"- memory: extractor `{s['extractor']}`, embedder `{s['embedder']}`, stores `{s['stores']}`; at most "
        f"{s['max_facts']} facts; decisions: " + "; ".join(f"{b}: {x}" for b, x in s["decisions"].items()),
        f"- **evidence coverage**: {cov['with_fact']}/{cov['evidence_turns']} evidence turns "
        f"({_f(cov['fraction'])}) have a stored fact — the ceiling of every backend's recall "
        f"({cov['mentions_with_fact']}/{cov['evidence_mentions']} evidence mentions)",
        f"- tokens: {s['tokenizer']}; latency: {s['latency']}; warm-up (first call per store, not counted): "
        + ", ".join(f"{b} {ms:.0f} ms" for b, ms in s["warmup_ms"].items()),
        f"- CIs: {s['bootstrap']}, 95%, {s['bootstrap_resamples']} resamples",
        "",
        "## Overall",
        "",
        "| system@k | n | recall [95% CI] | hit | complete | tokens | facts | p50 ms | p95 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in res.items():
        ci = r["recall_ci95"] or [r["recall"], r["recall"]]
        lines.append(f"| {name} | {r['n']} | {_f(r['recall'])} [{ci[0]:.3f}, {ci[1]:.3f}] | {_f(r['hit'])} | "
                     f"{_f(r['complete'])} | {_f(r['tokens'], 0)} | {_f(r['n_facts'], 1)} | {_f(r['p50_ms'], 1)} | "
                     f"{_f(r['p95_ms'], 1)} |")  # fmt: skip
    lines += ["", f"## Against {BM25} at the same k or token budget (paired)", "",
              "| backend@k | Δ recall [95% CI] | Δ hit [95% CI] |", "|---|---|---|"]  # fmt: skip
    for name, c in comp.items():
        lines.append(f"| {name} | {_d(c[f'recall_vs_{BM25}'])} | {_d(c[f'hit_vs_{BM25}'])} |")
    lines += ["", "## Against naive at equal facts (paired)", "",
              "Per question, `naive` asked for exactly as many facts as the backend returned.", "",
              "| backend@k | facts | recall | naive recall | Δ recall [95% CI] | Δ hit [95% CI] |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for name, c in comp.items():
        if "equal_facts" in c:
            e = c["equal_facts"]
            lines.append(f"| {name} | {_f(e['n_facts'], 1)} | {_f(res[name]['recall'])} | {_f(e['naive_recall'])} | "
                         f"{_d(e['recall_diff'])} | {_d(e['hit_diff'])} |")  # fmt: skip
    same_budget = {name: c for name, c in comp.items() if f"recall_vs_{NAIVE}" in c}
    if same_budget:
        lines += ["", f"## Against {NAIVE} at the same token budget (paired)", "",
                  "| backend@budget | recall | naive recall | Δ recall [95% CI] | Δ hit [95% CI] |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for name, c in same_budget.items():
            naive = f"{NAIVE}@{name.rsplit('@', 1)[1]}"
            lines.append(f"| {name} | {_f(res[name]['recall'])} | {_f(res[naive]['recall'])} | "
                         f"{_d(c[f'recall_vs_{NAIVE}'])} | {_d(c[f'hit_vs_{NAIVE}'])} |")  # fmt: skip
    cats = result["per_category"]
    lines += ["", "## Per category: recall / hit", "",
              "| system@k | " + " | ".join(f"{c} {v['name'] or ''} (n={v['n']})" for c, v in cats.items()) + " |",
              "|---" * (len(cats) + 1) + "|"]  # fmt: skip
    for name in res:
        cells = [f"{_f(v['results'][name]['recall'])} / {_f(v['results'][name]['hit'])}" for v in cats.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if cov["missing"]:
        shown = ", ".join(cov["missing"][:30]) + (
            f", … ({len(cov['missing'])} in all)" if len(cov["missing"]) > 30 else ""
        )
        lines += ["", f"Evidence turns without a stored fact: {shown}."]
    relations = result.get("relations")
    if relations:
        lines += ["", "## Relations", ""]
        if isinstance(relations.get("markdown"), str):
            lines.append(relations["markdown"].rstrip())
        else:
            lines += [f"- {k}: {v}" for k, v in relations.items() if not isinstance(v, (dict, list))]
            lines.append("- (full figures in retrieval.json, `relations`)")
    lines += [
        "",
        "## What was measured",
        "",
        "- Recall counts an evidence turn as retrieved when any returned fact was stored from it (its `source`); it "
        "says nothing of whether a responder would answer. Backends without an LLM make rule-based decisions.",
        "- Backends may return more facts than k (replies, traversal, paths): compare them at equal facts or at the "
        "same token budget (`@<N>tok`: facts taken in the backend's order while their prompt lines fit), not at "
        "equal k.",
        f"- {BM25} searches the raw turns, not the store: it does not depend on the extractor. Its texts are "
        "`<speaker>: <text>`; the turn extractor's facts also carry the session date, so they cost more tokens.",
        "- Latency is single-process, sequential, on this machine; the warm-up calls are excluded.",
        "- Questions of one conversation share a store and are correlated; the per-question bootstrap ignores that, so "
        "its CIs are narrower than a per-conversation one.",
    ]
    return "\n".join(lines) + "\n"


def render_png(result: dict[str, Any], path: Path) -> None:
    """Left: recall@k per system with its 95% CI. Right: recall against mean tokens, one line per system over k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks, res = result["settings"]["ks"], result["results"]
    systems = list(dict.fromkeys(name.rsplit("@", 1)[0] for name in res))
    fig, (ax_bar, ax_tok) = plt.subplots(1, 2, figsize=(max(9, 1.2 * len(ks) * len(systems) / 2 + 5), 4.5))
    width = 0.8 / len(systems)
    for j, system in enumerate(systems):
        rows = [res[f"{system}@{k}"] for k in ks]
        means = [r["recall"] for r in rows]
        cis = [r["recall_ci95"] or [r["recall"], r["recall"]] for r in rows]
        errs = [
            [m - c[0] for m, c in zip(means, cis, strict=True)],
            [c[1] - m for m, c in zip(means, cis, strict=True)],
        ]
        ax_bar.bar([i + j * width for i in range(len(ks))], means, width, yerr=errs, capsize=3, label=system)
        ax_tok.plot([r["tokens"] for r in rows], means, marker="o", label=system)
    ax_bar.set_xticks([i + 0.4 - width / 2 for i in range(len(ks))], [f"k={k}" for k in ks])
    ax_bar.set_ylim(0, 1.05)
    ax_bar.set_ylabel("evidence recall (95% CI)")
    ax_bar.legend(fontsize=8)
    ax_tok.set_xlabel("mean retrieved tokens")
    ax_tok.set_ylabel("evidence recall")
    ax_tok.set_ylim(0, 1.05)
    ax_tok.legend(fontsize=8)
    coverage = result["coverage"]["fraction"]
    if coverage is not None:
        ax_bar.axhline(coverage, color="black", linestyle="--", linewidth=0.8)
        ax_tok.axhline(coverage, color="black", linestyle="--", linewidth=0.8)
    fig.suptitle(f"memstate eval retrieval: {Path(result['data']['path']).name} ({result['data']['evaluated']} "
                 f"questions; dashed: evidence coverage)", fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(result: dict[str, Any], out_dir: str | Path) -> Path:
    """Write retrieval.json / .md / .png and retrieval_questions.jsonl into ``out_dir``; return it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = {k: v for k, v in result.items() if k != "questions"}
    (out / "retrieval.json").write_text(json.dumps(summary, indent=2))
    (out / "retrieval.md").write_text(render_markdown(result))
    render_png(result, out / "retrieval.png")
    with open(out / "retrieval_questions.jsonl", "w") as f:
        for rec in result.get("questions", []):
            f.write(json.dumps(rec) + "\n")
    return out


# ---- memstate eval retrieval -----------------------------------------------------------------------------------------


def make_parser(prog: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Evidence recall, hit, complete, tokens and latency of every memory backend at each k on a "
        "benchmark with evidence ids (LoCoMo), against BM25 over the raw turns and naive at equal facts; writes "
        "OUT/retrieval.md, .json, .png (evaluate/retrieval.py).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("data", help="A LoCoMo JSON file (the release's format: an array of samples).")
    p.add_argument("--out", required=True, help="Output dir: the report, and stores/ (reused by a re-run).")
    p.add_argument("--backends", nargs="+", help="Memory backends (default: every registered one).")
    p.add_argument("--k", nargs="+", type=int, default=[5, 10, 20], help="Facts asked of each backend.")
    p.add_argument("--budget", nargs="*", type=int, default=[565],
                   help="Token budgets: rows backend@<N>tok take facts in the backend's order while their prompt "
                   "lines fit (565: the paper's). None: K rows only.")  # fmt: skip
    p.add_argument("--tokenizer", metavar="DIR",
                   help="Count tokens with this (fast) tokenizer, e.g. the responder's (default: MiniLM's WordPiece, "
                   "the paper's unit).")  # fmt: skip
    p.add_argument("--depth", type=int, default=2,
                   help="Hops of relation traversal (SUPERSEDES/CONFLICTS_WITH; 0: none): what it adds.")  # fmt: skip
    p.add_argument("--categories", nargs="+", type=int, default=[1, 2, 3, 4],
                   help="LoCoMo question categories (5: adversarial, unanswerable).")  # fmt: skip
    p.add_argument("--extractor", choices=EXTRACTORS, default=DEFAULT_EXTRACTOR, help="As in `memstate memory ingest`.")
    p.add_argument("--extractor-url", "--extractor_url", help="OpenAI-compatible endpoint of the LLM extractor.")
    p.add_argument("--extractor-model", "--extractor_model", help="Model name of the LLM extractor.")
    p.add_argument("--embedder", help="Embedder of new stores: hash-N, a sentence-transformers path or hub id "
                   "(default: the store default, all-MiniLM-L6-v2).")  # fmt: skip
    p.add_argument("--bootstrap-resamples", "--bootstrap_resamples", type=int, default=2000)
    p.add_argument("--relations", metavar="MEMSYCO_JSONL",
                   help="Also measure the extractor's SUPERSEDES precision and recall on MemSyco-Bench "
                   "valid_memory_selection rows (memstate.evaluate.relations) and report them.")  # fmt: skip
    return p


def relations_section(path: str, extractor: str, budget_tokens: int | None = 565) -> dict[str, Any]:
    """Relation precision/recall of ``extractor`` (turns or rule) on a MemSyco-Bench file, and what evomem's traversal
    adds at ``budget_tokens``, with its Markdown."""
    from memstate.evaluate.relations import extractor_factory, relation_scores
    from memstate.memory.embed import default_embedder

    if extractor not in ("turns", "rule"):
        raise ConfigError(f"--relations measures the turns or rule extractor, not {extractor!r}")
    embedder = default_embedder()
    rows = [r for r in load_memsyco(path) if r.task == "valid_memory_selection"]
    if not rows:
        raise InputError(f"{path}: no valid_memory_selection rows (--relations needs them)")
    out = relation_scores(rows, extractor_factory(extractor, None), embedder, budget_tokens=budget_tokens)
    sup = out["supersedes"]
    out["markdown"] = (
        f"Extractor `{extractor}` on `{path}` ({out['rows']} valid_memory_selection rows; the memory items are only "
        f"the answer key): SUPERSEDES drawn {sup['drawn']}, correct {sup['correct']} (the current memory's turn "
        f"supersedes the outdated one's): **precision {sup['precision']}**, recall {sup['recall']} (rows with a "
        f"correct edge); CONFLICTS_WITH drawn {out['conflicts_with']['drawn']}; wrong edges by kind: {sup['wrong']}."
    )
    if "traversal" in out:
        t = out["traversal"]
        d0, d2 = t["depth_0"], t["depth_2"]
        out["markdown"] += (
            f"\n\nWhat traversal adds (evomem at {t['budget_tokens']} tokens, each row's question; per row: a current "
            f"turn retrieved / an outdated turn retrieved without any current one): depth 0 {d0['current']} / "
            f"{d0['outdated_only']}, depth 2 {d2['current']} / {d2['outdated_only']}; Δ current "
            f"{_d(t['current_depth_2_minus_0'])}, Δ outdated-only {_d(t['outdated_only_depth_2_minus_0'])}."
        )
    out["file"] = str(path)
    return out


def run(args: argparse.Namespace, *, relations: dict[str, Any] | None = None) -> None:
    """``relations``: an extra section (relation precision measured elsewhere) for retrieval.json and .md; with
    ``--relations FILE`` it is measured here."""
    if relations is None and args.relations:
        relations = relations_section(args.relations, args.extractor, args.budget[0] if args.budget else None)
    result = evaluate_retrieval(
        args.data,
        args.out,
        backends=args.backends,
        ks=args.k,
        budgets=args.budget,
        depth=args.depth,
        categories=args.categories,
        extractor=args.extractor,
        extractor_url=args.extractor_url,
        extractor_model=args.extractor_model,
        embedder=args.embedder,
        n_resamples=args.bootstrap_resamples,
        tokenizer=args.tokenizer,
    )
    if relations is not None:
        result["relations"] = relations
    out = write_report(result, args.out)
    print((out / "retrieval.md").read_text())
    print(f"chart: {out / 'retrieval.png'}")
