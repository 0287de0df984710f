"""Leave-one-conversation-out selection of evomem's retrieval settings on the five shipped LoCoMo conversations
(issue 57, "Selection that estimates generalization"): how much of evomem@565tok's in-sample hit / recall is fit to
the five conversations its settings were chosen on.

    PYTHONPATH=benchmarks .venv/bin/python benchmarks/retrieval_cv.py [--data third_party/data/locomo/locomo_dev5.json]
        [--stores runs/retrieval_cv/stores] [--budget 565] [--resamples 2000]
        [--out benchmarks/results/retrieval_cv.json]
    PYTHONPATH=benchmarks .venv/bin/python benchmarks/retrieval_cv.py --smoke --out /tmp/retrieval_cv.json  # seconds

``--smoke`` runs the same code on two conversations cut to their first session and three questions each, each
setting on its shipped and reference values only (32 configurations), 10 resamples, its stores in a temporary
directory (unless ``--stores``); its JSON says ``"smoke": true``.

The metric is `memstate eval retrieval`'s evomem@<budget>tok row, computed by its own code: questions of categories
1-4 (``evaluate.retrieval.select_questions``), ``memory.retrieve.retrieve(backend="evomem", depth=2,
budget_tokens=565)``: the budget counts each fact as the prompt shows it, ``memstate.prompts.format_fact``), the
returned facts mapped to their source turns and scored by ``evaluate.retrieval._row`` / ``score`` (recall, hit,
complete, tokens). With every setting at its shipped value the figures are eval retrieval's evomem@565tok row
(``reproduces_eval_retrieval`` in the JSON).

The settings (docs/memory.md, "Retrieval benchmark"; issue 45 / commit 11837d2), each on a grid of its shipped value
and the alternatives tried when it was chosen:

- ``context_weight`` (``memory/commit.py`` ``CONTEXT_WEIGHT`` = 0.5; tried 0 = no context, 0.3, 1.0): a fact's
  vector is its own vector plus this times the vector of the fact before it in its session, renormalized. Ingest
  time, but no re-ingest is needed: each fact's own vector (``embedding_text``) is encoded once per store, the
  matrix for a weight is rebuilt from those and written over the store's in-memory index (``store._index.matrix``,
  never the file). The shipped weight uses the stored matrix itself; the rebuilt one matches it within float error
  (``max_abs_diff_rebuilt_vs_stored`` in the JSON).
- ``replies`` (``memory/evomem.py`` ``REPLIES`` = 3; tried 0 = before issue 45, 1): the best seeds followed by the
  next fact of their session. A module global read at call time: set from here.
- ``label`` (``memory/turn_extractor.py`` ``label``: "Caroline (8 May, 2023): "; tried the time of day as well,
  "Caroline (1:56 pm on 8 May, 2023): "). Changes the fact texts (tokens under the budget, the FTS5 index), so it
  needs a second set of stores: ingested with ``turn_extractor.label`` replaced and ``commit.embedding_text``
  stripping the longer label, so that both sets have the vectors the shipped code computes ("Caroline: ...": only
  the label differs, not the vector).
- ``feedback`` (``memory/evomem.py`` ``EvomemSettings.feedback_facts`` x ``feedback_weight`` = 3 x 0.5; new in issue
  57, tried off, 1 x 0.25, 3 x 0.25): pseudo-relevance feedback, the query's vector moved toward the mean
  vector of its first hybrid results before a second hybrid search. ``pool`` (the hybrid candidates, 50) was on the
  first grid (30 / 100: no help held out) and is left at 50 here.
- ``rrf_k`` (``EvomemSettings.rrf_k`` = ``memory/search.py`` ``RRF_K`` = 10; tried 5): reciprocal rank fusion's
  constant.

- ``dates`` (``EvomemSettings.dates`` = on; new in issue 57): a question that names a calendar date adds a third
  ranking, the nearest facts said within that span (``memory/dates.py``).

The query-time settings (replies, feedback, rrf_k, dates) are passed to ``retrieve`` as an ``EvomemSettings``.

Every combination is measured (2 labels x 4 weights x 3 replies x 4 feedbacks x 2 constants x 2 = 384
configurations, each over the 760 questions); the query vectors do not depend on any setting and are computed once per
store.

Selection: a configuration is chosen by its mean recall over the questions of the chosen-on conversations (as the
settings were chosen; ties by hit, then by the fewest departures from the shipped values), and separately by mean hit
(ties by recall): both are reported (``summary_by_criterion``). Per setting, one at a time (the others at their
shipped values): in-sample = chosen on all five and scored on all five; leave-one-conversation-out (LOO) = for each
conversation, chosen on the other four and scored on it; the LOO estimate is the mean over all 760 questions, each
scored by the fold that held its conversation out (the question-weighted mean of the five fold scores; the
unweighted mean is also given). The whole configuration is chosen the same way in each fold, two ways: jointly (the
best of all 384) and coordinate-wise (from the reference configuration, each setting in turn set to its best value
given the others, until nothing changes; not from the shipped one, whose values were chosen on the held-out
conversation too). CIs: 95% percentile bootstrap over questions, resampled within each
conversation, with the selection redone in every resample (so they include the choice's own variability); they
ignore that one conversation's questions share a store (five conversations are too few to resample). Paired
differences against the reference (each setting's value before issue 45, or the shipped one where it was not
changed) use the same resamples.

The query-time settings go through ``EvomemSettings``; the ingest-time ones are set from here (the label function
patched for the second set of stores, the in-memory index overwritten for a context weight), which is why this is a
benchmark script and not ``eval retrieval --cv``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import memstate.memory.commit as commit_mod
import memstate.memory.turn_extractor as turn_mod
from memstate.evaluate.retrieval import FACT_FORMAT, _row, select_questions
from memstate.memory.cli import store_name
from memstate.memory.embed import normalize
from memstate.memory.evomem import EvomemSettings
from memstate.memory.extract import make_extractor
from memstate.memory.ingest import locomo_sessions
from memstate.memory.records import fact_num
from memstate.memory.retrieve import retrieve
from memstate.memory.store import MemoryStore
from memstate.memory.tokens import token_counter
from memstate.prompts import date_of, format_fact
from memstate.sources.locomo import read_locomo

ROOT = Path(__file__).resolve().parents[1]
CATEGORIES = (1, 2, 3, 4)
DEPTH = 2

# name -> shipped value, grid, reference (the value before issue 45, or the shipped one where it was not changed),
# where it lives.
SETTINGS: dict[str, dict[str, Any]] = {
    "label": {
        "current": "day",
        "values": ["day", "time"],
        "reference": "time",
        "where": "memory/turn_extractor.py label() (date_of); ingest time: a second set of stores",
        "tried": "time of day in the label: 48 -> 43 tokens a fact, +0.018 recall (docs/memory.md)",
    },
    "context_weight": {
        "current": 0.5,
        "values": [0.0, 0.3, 0.5, 1.0],
        "reference": 0.0,
        "where": "memory/commit.py CONTEXT_WEIGHT (fact_vectors); ingest time: matrix rebuilt in memory",
        "tried": "0.3: 0.754, 1.0: 0.749, 0.5: 0.760 recall; no context 0.735 (docs/memory.md)",
    },
    "replies": {
        "current": 3,
        "values": [0, 1, 3],
        "reference": 0,
        "where": "memory/evomem.py REPLIES (evomem_search -> with_replies)",
        "tried": "3: +0.010 recall, +0.014 hit; 1: +0.010, +0.010 (memory/evomem.py)",
    },
    "feedback": {
        "current": "3x0.5",
        "values": ["off", "1x0.25", "3x0.25", "3x0.5"],
        "reference": "off",
        "where": "memory/evomem.py EvomemSettings.feedback_facts x feedback_weight (pseudo-relevance feedback)",
        "tried": "new in issue 57: the query vector moved toward the mean of its first hybrid results (Rocchio); "
        "2x0.25 and 4x0.5 on a first run: 0.829 / 0.825 hit",
    },
    "rrf_k": {
        "current": 10,
        "values": [5, 10],
        "reference": 10,
        "where": "memory/evomem.py EvomemSettings.rrf_k (memory/search.py RRF_K)",
        "tried": "5: +0.008 to +0.013, not kept as one more constant fitted to these conversations (docs/memory.md)",
    },
    "dates": {
        "current": True,
        "values": [False, True],
        "reference": False,
        "where": "memory/evomem.py EvomemSettings.dates (memory/dates.py question_span)",
        "tried": "new in issue 57: a question naming a calendar date adds a ranking of the facts said then",
    },
}
NAMES = list(SETTINGS)
_LABEL = turn_mod.label
_EMBEDDING_TEXT = commit_mod.embedding_text


# ---- the settings, set from here -------------------------------------------------------------------------------------


def query_settings(replies: int, feedback: str, rrf_k: int, dates: bool) -> EvomemSettings:
    """The query-time settings as evomem's settings dataclass (passed to ``retrieve``)."""
    facts, weight = (0, 0.0) if feedback == "off" else (int(feedback.split("x")[0]), float(feedback.split("x")[1]))
    return EvomemSettings(replies=replies, feedback_facts=facts, feedback_weight=weight, rrf_k=rrf_k, dates=dates)


def _time_label(turn: Any) -> str:
    """The label before issue 45: the session's full time, time of day included."""
    who = turn.speaker or turn.role
    return f"{who} ({turn.time}): " if turn.time else f"{who}: "


def embedding_text(text: str, time_: str | None, label: str) -> str:
    """``turn_extractor.embedding_text`` for stores of either label: the text without its date label."""
    if not time_:
        return text
    shown = date_of(time_) if label == "day" else time_
    return text.replace(f" ({shown}): ", ": ", 1)


def set_ingest_label(label: str) -> None:
    if label == "day":
        turn_mod.label, commit_mod.embedding_text = _LABEL, _EMBEDDING_TEXT
    else:
        turn_mod.label = _time_label
        commit_mod.embedding_text = lambda text, time_: embedding_text(text, time_, "time")


# ---- stores ----------------------------------------------------------------------------------------------------------


def open_stores(root: Path, label: str, samples: list, timing: dict) -> dict[str, MemoryStore]:
    """The samples' stores for ``label`` (ingested where missing, reused otherwise)."""
    store_dir = root / f"label-{label}"
    marker = store_dir / "ingest.json"
    settings = {"extractor": "turns", "fact_format": FACT_FORMAT, "label": label, "context_weight": 0.5}
    if marker.is_file() and json.loads(marker.read_text()) != settings:
        sys.exit(f"{store_dir}: built with {marker.read_text()}, not {settings}: delete it or give another --stores")
    store_dir.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(settings))
    set_ingest_label(label)
    extractor = make_extractor("turns")
    stores, start = {}, time.perf_counter()
    new_sessions = 0
    for sample in samples:
        store = MemoryStore(store_dir / store_name(sample.id))
        reports = store.ingest(locomo_sessions(sample), extractor)
        new_sessions += sum(r.status != "duplicate" for r in reports)
        stores[sample.id] = store
    set_ingest_label("day")
    timing[f"ingest_label_{label}_s"] = round(time.perf_counter() - start, 1)
    timing[f"ingest_label_{label}_new_sessions"] = new_sessions
    return stores


class Vectors:
    """A store's own fact vectors and the fact before each in its session: the index matrix for any context weight."""

    def __init__(self, store: MemoryStore, label: str) -> None:
        _, matrix = store.index_view()
        facts = store.facts()  # oldest first: a session's facts are committed together, in order
        self.store, self.stored = store, matrix.copy()
        own = normalize(store.embedder.encode([embedding_text(f.text, f.time, label) for f in facts]))
        rows = store.rows_of([fact_num(f.id) for f in facts])
        self.own = np.zeros_like(self.stored)
        self.own[rows] = own
        self.before = np.zeros_like(self.stored)
        for i in range(1, len(facts)):
            if facts[i].session == facts[i - 1].session:
                self.before[rows[i]] = own[i - 1]
        self.max_abs_diff = float(np.abs(self.rebuilt(SETTINGS["context_weight"]["current"]) - self.stored).max())

    def rebuilt(self, weight: float) -> np.ndarray:
        return normalize(self.own + weight * self.before).astype(np.float32)

    def use(self, weight: float) -> None:
        """Write the matrix for ``weight`` over the store's in-memory index (the shipped weight: the stored one)."""
        idx = self.store._index
        new = self.stored if weight == SETTINGS["context_weight"]["current"] else self.rebuilt(weight)
        idx.matrix[: idx.n] = new


# ---- measuring -------------------------------------------------------------------------------------------------------


def measure(store: MemoryStore, questions: list, vectors: list[np.ndarray], budget: int, tokens: Any,
            settings: EvomemSettings) -> dict:  # fmt: skip
    """evomem@<budget>tok per question, as `memstate eval retrieval` scores it."""
    sources_of = {f.id: f.source for f in store.facts()}
    out: dict[str, list[float]] = {
        k: [] for k in ("recall", "hit", "complete", "tokens", "text_tokens", "n_facts", "ms")
    }
    for q, vec in zip(questions, vectors, strict=True):
        start = time.perf_counter()
        got = retrieve(store, q.text, backend="evomem", depth=DEPTH, budget_tokens=budget, query_vector=vec,
                       settings=settings)  # fmt: skip
        ms = 1000 * (time.perf_counter() - start)
        texts, lines = [f.text for f in got.facts], [format_fact(f) for f in got.facts]
        row = _row(q, [sources_of.get(i) for i in got.store_ids], texts, ms, tokens, lines)
        for key in out:
            out[key].append(float(row[key]))
    return out


# ---- selection -------------------------------------------------------------------------------------------------------


def departures(config: tuple) -> int:
    return sum(v != SETTINGS[n]["current"] for n, v in zip(NAMES, config, strict=True))


class Table:
    """Per configuration and conversation, the sums of recall and hit over (resampled) questions and their count."""

    def __init__(self, configs: list[tuple], rec: np.ndarray, hit: np.ndarray, count: np.ndarray, primary: str):
        self.configs, self.count = configs, count  # rec/hit: (C, V) sums; count: (V,)
        self.index = {c: i for i, c in enumerate(configs)}
        self.sums = {"recall": rec, "hit": hit}
        second = "hit" if primary == "recall" else "recall"
        self.primary, self.second = primary, second
        self.tiebreak = 1e-12 * np.array([departures(c) for c in configs])

    def means(self, convs: list[int]) -> dict[str, np.ndarray]:
        n = self.count[convs].sum()
        return {m: s[:, convs].sum(axis=1) / n for m, s in self.sums.items()}

    def best(self, candidates: list[int], convs: list[int]) -> int:
        m = self.means(convs)
        key = m[self.primary] + 1e-6 * m[self.second] - self.tiebreak
        return candidates[int(np.argmax(key[candidates]))]

    # the three selection rules: one setting (others shipped), joint, coordinate-wise
    def one_setting(self, name: str, convs: list[int]) -> int:
        j = NAMES.index(name)
        cur = tuple(SETTINGS[n]["current"] for n in NAMES)
        cands = [self.index[cur[:j] + (v,) + cur[j + 1 :]] for v in SETTINGS[name]["values"]]
        return self.best(cands, convs)

    def joint(self, convs: list[int]) -> int:
        return self.best(list(range(len(self.configs))), convs)

    def coordinate(self, convs: list[int], rounds: int = 10) -> int:
        # From the values before these changes, never the shipped ones: those were chosen on every conversation, the
        # held-out one too, and a search that starts there and stops early would keep that choice.
        config = tuple(SETTINGS[n]["reference"] for n in NAMES)
        for _ in range(rounds):
            before = config
            for j, name in enumerate(NAMES):
                cands = [self.index[config[:j] + (v,) + config[j + 1 :]] for v in SETTINGS[name]["values"]]
                config = self.configs[self.best(cands, convs)]
            if config == before:
                break
        return self.index[config]

    def evaluate(self, rule: Any) -> dict[str, Any]:
        """In-sample and LOO of a selection rule: ``rule(convs) -> config index``."""
        allv = list(range(len(self.count)))
        chosen = rule(allv)
        ins = self.means(allv)
        folds = [rule([v for v in allv if v != f]) for f in allv]
        held = {m: sum(self.sums[m][c, f] for f, c in enumerate(folds)) / self.count.sum() for m in self.sums}
        per_fold = {m: [self.sums[m][c, f] / self.count[f] for f, c in enumerate(folds)] for m in self.sums}
        return {"chosen": chosen, "in_sample": {m: ins[m][chosen] for m in ins}, "folds": folds, "loo": held,
                "loo_fold_scores": per_fold}  # fmt: skip


def stratified_weights(conv_of: np.ndarray, n_resamples: int, seed: int = 0) -> np.ndarray:
    """(B, Q) counts: each conversation's questions resampled with replacement within it."""
    rng = np.random.default_rng(seed)
    w = np.zeros((n_resamples, len(conv_of)))
    for v in np.unique(conv_of):
        idx = np.flatnonzero(conv_of == v)
        draws = idx[rng.integers(0, len(idx), size=(n_resamples, len(idx)))]
        for b in range(n_resamples):
            w[b] += np.bincount(draws[b], minlength=len(conv_of))
    return w


def ci(values: list[float] | np.ndarray) -> list[float]:
    lo, hi = np.percentile(values, [2.5, 97.5])
    return [_r(lo), _r(hi)]


# ---- main ------------------------------------------------------------------------------------------------------------


def boot_means(values: np.ndarray, i: int, w: np.ndarray) -> np.ndarray:
    """Configuration ``i``'s mean under each resample's question counts ``w`` (B, Q)."""
    return (w @ values[i]) / w.sum(axis=1)


def select(
    criterion: str, configs: list[tuple], rec: np.ndarray, hit: np.ndarray, onehot: np.ndarray, convs: list[str],
    w: np.ndarray,
) -> dict[str, Any]:  # fmt: skip
    """Every selection rule's in-sample and LOO figures, by ``criterion``, with bootstrap CIs over the resamples
    ``w`` (selection redone in each)."""
    nv, count = len(convs), onehot.sum(axis=0)
    point = Table(configs, rec @ onehot, hit @ onehot, count, criterion)
    cur = tuple(SETTINGS[n]["current"] for n in NAMES)
    ref_i = point.index[tuple(SETTINGS[n]["reference"] for n in NAMES)]
    cur_i = point.index[cur]

    rules: dict[str, Any] = {f"setting:{n}": functools.partial(Table.one_setting, name=n) for n in NAMES}
    rules["config:joint"] = Table.joint
    rules["config:coordinate"] = Table.coordinate

    def run(table: Table, rule: Any) -> dict:
        return table.evaluate(lambda v: rule(table, convs=v))

    def base_of(table: Table, name: str) -> int:
        return ref_i if name.startswith("config") else _ref_of(table, name)

    point_out = {name: run(point, rule) for name, rule in rules.items()}
    keys = ("loo_recall", "loo_hit", "in_recall", "in_hit", "d_recall", "d_hit", "s_recall", "s_hit", "chosen")
    boot: dict[str, dict[str, list]] = {name: {k: [] for k in keys} for name in rules}
    for b in range(len(w)):
        wb = w[b][:, None] * onehot  # (Q, V)
        table = Table(configs, rec @ wb, hit @ wb, wb.sum(axis=0), criterion)
        full = table.means(list(range(nv)))
        for name, rule in rules.items():
            r = run(table, rule)
            boot[name]["chosen"].append(r["chosen"])
            for m in ("recall", "hit"):
                boot[name][f"loo_{m}"].append(r["loo"][m])
                boot[name][f"in_{m}"].append(r["in_sample"][m])
                boot[name][f"d_{m}"].append(r["loo"][m] - full[m][base_of(table, name)])
                boot[name][f"s_{m}"].append(r["loo"][m] - full[m][cur_i])

    summary: dict[str, Any] = {}
    full = point.means(list(range(nv)))
    for name, r in point_out.items():
        bb, base = boot[name], base_of(point, name)
        freq: dict[int, int] = {}
        for c in bb["chosen"]:
            freq[c] = freq.get(c, 0) + 1
        entry = {
            "in_sample_choice": _named(configs[r["chosen"]], name),
            "in_sample": {m: _r(r["in_sample"][m]) for m in ("recall", "hit")},
            "in_sample_ci95": {m: ci(bb[f"in_{m}"]) for m in ("recall", "hit")},
            "in_sample_choice_frequency_in_resamples": [
                [_named(configs[c], name), round(k / len(w), 3)] for c, k in sorted(freq.items(), key=lambda x: -x[1])
            ][:5],
            "loo": {m: _r(r["loo"][m]) for m in ("recall", "hit")},
            "loo_ci95": {m: ci(bb[f"loo_{m}"]) for m in ("recall", "hit")},
            "loo_unweighted_fold_mean": {m: _r(np.mean(r["loo_fold_scores"][m])) for m in ("recall", "hit")},
            "loo_fold_scores": {m: [_r(x) for x in r["loo_fold_scores"][m]] for m in ("recall", "hit")},
            "fold_choices": {convs[f]: _named(configs[c], name) for f, c in enumerate(r["folds"])},
            "stable": len(set(r["folds"])) == 1,
            "reference": _named(configs[base], name),
            "reference_score": {m: _r(full[m][base]) for m in ("recall", "hit")},
            "loo_minus_reference": {
                m: {"mean": _r(r["loo"][m] - full[m][base]), "ci95": ci(bb[f"d_{m}"])} for m in ("recall", "hit")
            },
            "loo_minus_shipped_in_sample": {
                m: {"mean": _r(r["loo"][m] - full[m][cur_i]), "ci95": ci(bb[f"s_{m}"])} for m in ("recall", "hit")
            },
        }
        if name.startswith("setting:"):
            n = name.split(":", 1)[1]
            j = NAMES.index(n)
            entry["values"] = {}
            for v in SETTINGS[n]["values"]:
                i = point.index[cur[:j] + (v,) + cur[j + 1 :]]
                entry["values"][str(v)] = {
                    "all_five": {m: _r(full[m][i]) for m in ("recall", "hit")},
                    "per_conversation": {
                        m: [_r(point.sums[m][i, f] / count[f]) for f in range(nv)] for m in ("recall", "hit")
                    },
                }
        summary[name] = entry
    return summary


def _r(x: float) -> float:
    return round(float(x), 6)


def smoke_samples(samples: list, conversations: int = 2, sessions: int = 1, questions: int = 3) -> list:
    """``--smoke``'s data: the first conversations cut to their first sessions, each with its first questions of
    ``CATEGORIES`` whose evidence all lies in those sessions."""
    out = []
    for sample in samples[:conversations]:
        kept = {t.dia_id for s in sample.sessions[:sessions] for t in s.turns}
        qa = [q for q in sample.qa if q.category in CATEGORIES and q.evidence and set(q.evidence) <= kept]
        out.append(dataclasses.replace(sample, sessions=sample.sessions[:sessions], qa=tuple(qa[:questions])))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default=str(ROOT / "third_party/data/locomo/locomo_dev5.json"))
    p.add_argument("--stores", default=None, help="Reused by a rerun. Default: runs/retrieval_cv/stores "
                   "(--smoke: a temporary one).")  # fmt: skip
    p.add_argument("--budget", type=int, default=565)
    p.add_argument("--resamples", type=int, default=None, help="Default: 2000 (--smoke: 10).")
    p.add_argument("--smoke", action="store_true", help="Seconds, the same code: see the module docstring.")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/retrieval_cv.json"))
    args = p.parse_args()
    args.resamples = args.resamples or (10 if args.smoke else 2000)
    if args.smoke:  # each setting on its shipped and reference values only
        for s in SETTINGS.values():
            s["values"] = [v for v in s["values"] if v in (s["current"], s["reference"])]
    with tempfile.TemporaryDirectory(prefix="retrieval_cv_") as tmp:
        if args.stores is None:
            args.stores = tmp if args.smoke else str(ROOT / "runs/retrieval_cv/stores")
        run(args)


def run(args: argparse.Namespace) -> None:
    t_all = time.perf_counter()
    timing: dict[str, Any] = {}

    data = read_locomo(args.data)
    if args.smoke:
        data.samples = smoke_samples(data.samples)
    questions, left_out = select_questions(data.samples, CATEGORIES)
    convs = [s.id for s in data.samples]
    by_conv = {c: [q for q in questions if q.sample == c] for c in convs}
    order = [q for c in convs for q in by_conv[c]]
    conv_of = np.array([convs.index(q.sample) for q in order])
    tokens = token_counter()

    configs = list(itertools.product(*(SETTINGS[n]["values"] for n in NAMES)))
    res: dict[tuple, dict[str, np.ndarray]] = {}
    rebuild_diff: dict[str, dict[str, float]] = {}
    t_eval = 0.0
    for label in SETTINGS["label"]["values"]:
        stores = open_stores(Path(args.stores), label, data.samples, timing)
        start = time.perf_counter()
        vecs = {c: Vectors(stores[c], label) for c in convs}
        qvecs = {c: [stores[c].embed_query(q.text) for q in by_conv[c]] for c in convs}
        timing[f"encode_label_{label}_s"] = round(time.perf_counter() - start, 1)
        rebuild_diff[label] = {c: v.max_abs_diff for c, v in vecs.items()}
        start = time.perf_counter()
        for weight in SETTINGS["context_weight"]["values"]:
            for c in convs:
                vecs[c].use(weight)
            for replies, feedback, rrf_k, dates in itertools.product(*(SETTINGS[n]["values"] for n in NAMES[2:])):
                settings = query_settings(replies, feedback, rrf_k, dates)
                parts = [measure(stores[c], by_conv[c], qvecs[c], args.budget, tokens, settings) for c in convs]
                res[(label, weight, replies, feedback, rrf_k, dates)] = {
                    k: np.concatenate([x[k] for x in parts]) for k in parts[0]
                }
            print(f"label {label}, weight {weight}: {time.perf_counter() - start:.0f} s", flush=True)
        t_eval += time.perf_counter() - start
        for c in convs:
            vecs[c].use(SETTINGS["context_weight"]["current"])
            stores[c].close()
    timing["measure_s"] = round(t_eval, 1)
    timing["retrieve_calls"] = len(configs) * len(order)

    # per configuration and conversation
    nv = len(convs)
    onehot = np.zeros((len(order), nv))
    onehot[np.arange(len(order)), conv_of] = 1
    rec = np.stack([res[c]["recall"] for c in configs])  # (C, Q)
    hit = np.stack([res[c]["hit"] for c in configs])
    count = onehot.sum(axis=0)
    cur = tuple(SETTINGS[n]["current"] for n in NAMES)
    ref = tuple(SETTINGS[n]["reference"] for n in NAMES)
    start = time.perf_counter()
    w = stratified_weights(conv_of, args.resamples)
    selections = {crit: select(crit, configs, rec, hit, onehot, convs, w) for crit in ("recall", "hit")}
    timing["selection_and_bootstrap_s"] = round(time.perf_counter() - start, 1)
    point = Table(configs, rec @ onehot, hit @ onehot, count, "recall")
    cur_i = point.index[cur]
    shipped_ci = {m: ci(boot_means(rec if m == "recall" else hit, cur_i, w)) for m in ("recall", "hit")}

    per_config = {
        "|".join(f"{n}={v}" for n, v in zip(NAMES, c, strict=True)): {
            "recall": _r(rec[i].mean()),
            "hit": _r(hit[i].mean()),
            "tokens": round(float(res[c]["tokens"].mean()), 1),
            "text_tokens": round(float(res[c]["text_tokens"].mean()), 1),
            "n_facts": round(float(res[c]["n_facts"].mean()), 2),
            "p50_ms": round(float(np.percentile(res[c]["ms"], 50)), 2),
            "per_conversation_recall": [_r(point.sums["recall"][i, f] / count[f]) for f in range(nv)],
            "per_conversation_hit": [_r(point.sums["hit"][i, f] / count[f]) for f in range(nv)],
        }
        for i, c in enumerate(configs)
    }
    shipped = per_config["|".join(f"{n}={v}" for n, v in zip(NAMES, cur, strict=True))]
    timing["total_s"] = round(time.perf_counter() - t_all, 1)
    results: dict[str, Any] = {"smoke": True} if args.smoke else {}
    results |= {
        "benchmark": "retrieval_cv: leave-one-conversation-out selection of evomem's retrieval settings (issue 57)",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "nice": os.nice(0),
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        },
        "timing": timing,
        "data": {
            "path": os.path.relpath(args.data, ROOT),
            "conversations": convs,
            "questions": len(order),
            "questions_per_conversation": [int(x) for x in count],
            "left_out": left_out,
            "categories": list(CATEGORIES),
        },  # fmt: skip
        "metric": f"evomem@{args.budget}tok (retrieve(backend='evomem', depth={DEPTH}, budget_tokens={args.budget}); "
        "evaluate.retrieval._row / score)",
        "selection": {
            "criterion": "mean recall (summary_by_criterion.recall) or hit (.hit) over the chosen-on conversations' "
            "questions; ties: the other metric, then "
            "the fewest departures from the shipped values",
            "per_setting": "one setting varied, the others at their shipped values",
            "config:joint": "the best of all configurations in each fold",
            "config:coordinate": "from the reference configuration, each setting in turn at its best value given the "
            "others, until no change",
            "loo": "each question scored by the configuration chosen on the other four conversations; mean over all "
            "questions (= question-weighted mean of the fold scores)",
            "ci": f"95% percentile bootstrap, {args.resamples} resamples of questions within each conversation, "
            "selection redone in each resample; not clustered by conversation",
        },
        "settings": SETTINGS,
        "shipped_configuration": dict(zip(NAMES, cur, strict=True)),
        "reference_configuration": dict(zip(NAMES, ref, strict=True)),
        "shipped": shipped,
        "shipped_ci95": shipped_ci,
        "reproduces_eval_retrieval": {
            "compare_with": "memstate eval retrieval's evomem@565tok row (benchmarks/results/retrieval_eval.json)",
            "measured": {"recall": shipped["recall"], "hit": shipped["hit"]},
        },  # fmt: skip
        "max_abs_diff_rebuilt_vs_stored": rebuild_diff,
        "summary_by_criterion": selections,
        "per_configuration": per_config,
    }
    print_table(results)
    _write(results, args.out)


def _ref_of(table: Table, name: str) -> int:
    """The configuration with one setting at its reference value, the others shipped."""
    n = name.split(":", 1)[1]
    j = NAMES.index(n)
    cur = tuple(SETTINGS[x]["current"] for x in NAMES)
    return table.index[cur[:j] + (SETTINGS[n]["reference"],) + cur[j + 1 :]]


def _named(config: tuple, name: str) -> Any:
    if name.startswith("setting:"):
        return config[NAMES.index(name.split(":", 1)[1])]
    return dict(zip(NAMES, config, strict=True))


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _write(results: dict, out: str) -> None:
    """``results_io.report`` without printing the whole JSON (144 configurations): the table above is the figures."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {path}")


def print_table(results: dict) -> None:
    sh = results["shipped"]
    print(f"\nshipped configuration {results['shipped_configuration']}: recall {sh['recall']:.3f} hit {sh['hit']:.3f}, "
          f"{sh['tokens']:.0f} rendered tokens ({sh['text_tokens']:.0f} of fact text), "
          f"{sh['n_facts']:.1f} facts")  # fmt: skip
    for crit, s in results["summary_by_criterion"].items():
        print(f"\n## chosen by {crit}\n")
        print("| setting | values (recall / hit on all five, others shipped) | in-sample choice: recall / hit | "
              "LOO recall [95% CI] | LOO hit [95% CI] | fold choices | LOO − reference: recall; hit |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        for name, e in s.items():
            vals = "; ".join(f"{v}: {x['all_five']['recall']:.3f} / {x['all_five']['hit']:.3f}"
                             for v, x in e.get("values", {}).items()) or "all combinations"  # fmt: skip
            choice = _short(e["in_sample_choice"])
            folds = ", ".join(_short(f) for f in e["fold_choices"].values())
            lr, lh, d = e["loo_ci95"]["recall"], e["loo_ci95"]["hit"], e["loo_minus_reference"]
            print(f"| {name} | {vals} | {choice}: {e['in_sample']['recall']:.3f} / {e['in_sample']['hit']:.3f} | "
                  f"{e['loo']['recall']:.3f} [{lr[0]:.3f}, {lr[1]:.3f}] | "
                  f"{e['loo']['hit']:.3f} [{lh[0]:.3f}, {lh[1]:.3f}] | "
                  f"{folds} ({'stable' if e['stable'] else 'unstable'}) | "
                  f"{d['recall']['mean']:+.3f} [{d['recall']['ci95'][0]:+.3f}, {d['recall']['ci95'][1]:+.3f}]; "
                  f"{d['hit']['mean']:+.3f} [{d['hit']['ci95'][0]:+.3f}, {d['hit']['ci95'][1]:+.3f}] "
                  f"vs {_short(e['reference'])} |")  # fmt: skip
        for name in ("config:joint", "config:coordinate"):
            d = s[name]["loo_minus_shipped_in_sample"]
            print(f"{name}: LOO − shipped in-sample: recall {d['recall']['mean']:+.3f} "
                  f"[{d['recall']['ci95'][0]:+.3f}, {d['recall']['ci95'][1]:+.3f}], hit {d['hit']['mean']:+.3f} "
                  f"[{d['hit']['ci95'][0]:+.3f}, {d['hit']['ci95'][1]:+.3f}]")  # fmt: skip
    print(f"\nconfigurations as {'/'.join(NAMES)}; timing: {results['timing']}")


def _short(choice: Any) -> str:
    return "/".join(str(v) for v in choice.values()) if isinstance(choice, dict) else str(choice)


if __name__ == "__main__":
    main()
