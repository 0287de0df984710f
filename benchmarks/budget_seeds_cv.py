"""Each backend at its best under a token budget (issue 57): how many seeds (``Backend.budget_seeds``, the ``k`` a
backend is asked for under a budget) each backend should be asked for, chosen by leave-one-conversation-out on the
five shipped LoCoMo conversations.

    .venv/bin/python benchmarks/budget_seeds_cv.py [--data third_party/data/locomo/locomo_dev5.json]
        [--stores runs/budget_seeds_cv/stores] [--budget 565] [--backends memsearch clag naive evomem]
        [--seeds 5 10 20 30 50] [--out benchmarks/results/budget_seeds_cv.json]
    .venv/bin/python benchmarks/budget_seeds_cv.py --smoke --out /tmp/budget_seeds_cv.json  # seconds: a check

``--smoke`` runs the same code on two conversations cut to their first session and three questions each, two
seed counts, 20 resamples, its stores in a temporary directory (unless ``--stores``); its JSON says ``"smoke": true``.

A backend whose order puts weak facts early (memsearch's path order) fills the budget with them when asked for many
seeds. For each backend and seed count every question of categories 1-4 is retrieved at ``--budget`` rendered tokens
(``memory.retrieve.retrieve(budget_tokens=...)``, rule-based decisions, depth 2) and scored like ``memstate eval
retrieval`` (``evaluate.retrieval.score``). The seed count is chosen by mean hit (ties: recall, then the larger
count), in-sample on all five conversations and, for the held-out estimate, on four and scored on the fifth (the
mean over all questions, each scored by the fold that held its conversation out). CIs: 95% percentile bootstrap
over questions within each conversation, the choice redone in each resample.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import numpy as np
from results_io import report

from memstate.evaluate.retrieval import score, select_questions
from memstate.memory.backends import BACKENDS, get_backend
from memstate.memory.cli import store_name
from memstate.memory.extract import make_extractor
from memstate.memory.ingest import locomo_sessions
from memstate.memory.retrieve import retrieve
from memstate.memory.store import MemoryStore
from memstate.sources.locomo import read_locomo

ROOT = Path(__file__).resolve().parents[1]


def choose(hit: np.ndarray, rec: np.ndarray, w: np.ndarray, convs: np.ndarray, keep: np.ndarray) -> int:
    """Index of the best seed count on the questions of ``keep`` conversations under weights ``w``."""
    mask = w * np.isin(convs, keep)
    h, r = hit @ mask / mask.sum(), rec @ mask / mask.sum()
    return int(np.lexsort((np.arange(len(h)), r, h))[-1])


def loo(hit: np.ndarray, rec: np.ndarray, w: np.ndarray, convs: np.ndarray) -> tuple[float, float, list[int]]:
    ids = np.unique(convs)
    got_h = got_r = 0.0
    folds = []
    for v in ids:
        c = choose(hit, rec, w, convs, ids[ids != v])
        folds.append(c)
        m = w * (convs == v)
        got_h += hit[c] @ m
        got_r += rec[c] @ m
    return got_h / w.sum(), got_r / w.sum(), folds


def smoke_samples(samples: list, conversations: int = 2, sessions: int = 1, questions: int = 3) -> list:
    """``--smoke``'s data: the first conversations cut to their first sessions, each with its first questions of
    categories 1-4 whose evidence all lies in those sessions."""
    out = []
    for sample in samples[:conversations]:
        kept = {t.dia_id for s in sample.sessions[:sessions] for t in s.turns}
        qa = [q for q in sample.qa if q.category in (1, 2, 3, 4) and q.evidence and set(q.evidence) <= kept]
        out.append(dataclasses.replace(sample, sessions=sample.sessions[:sessions], qa=tuple(qa[:questions])))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(ROOT / "third_party/data/locomo/locomo_dev5.json"))
    p.add_argument("--stores", default=None, help="default: runs/budget_seeds_cv/stores (--smoke: a temporary one)")
    p.add_argument("--budget", type=int, default=565)
    p.add_argument("--backends", nargs="+", default=["memsearch", "clag", "naive", "evomem"])
    p.add_argument("--seeds", nargs="+", type=int, default=None, help="default: 5 10 20 30 50 (--smoke: 5 20)")
    p.add_argument("--resamples", type=int, default=None, help="default: 2000 (--smoke: 20)")
    p.add_argument("--smoke", action="store_true", help="seconds, the same code: see the module docstring")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/budget_seeds_cv.json"))
    args = p.parse_args()
    args.seeds = args.seeds or ([5, 20] if args.smoke else [5, 10, 20, 30, 50])
    args.resamples = args.resamples or (20 if args.smoke else 2000)
    with tempfile.TemporaryDirectory(prefix="budget_seeds_cv_") as tmp:
        if args.stores is None:
            args.stores = tmp if args.smoke else str(ROOT / "runs/budget_seeds_cv/stores")
        run(args)


def run(args: argparse.Namespace) -> None:
    start = time.perf_counter()
    data = read_locomo(args.data)
    if args.smoke:
        data.samples = smoke_samples(data.samples)
    questions, _ = select_questions(data.samples, (1, 2, 3, 4))
    ids = [s.id for s in data.samples]
    convs = np.array([ids.index(q.sample) for q in questions])
    extractor = make_extractor("turns")
    scores: dict[str, dict[int, list[dict]]] = {b: {n: [] for n in args.seeds} for b in args.backends}
    for sample in data.samples:
        Path(args.stores).mkdir(parents=True, exist_ok=True)
        with MemoryStore(Path(args.stores) / store_name(sample.id)) as store:
            store.ingest(locomo_sessions(sample), extractor)
            sources = {f.id: f.source for f in store.facts()}
            for q in (q for q in questions if q.sample == sample.id):
                vec = store.embed_query(q.text)
                for backend in args.backends:
                    spec = get_backend(backend)
                    for n in args.seeds:
                        BACKENDS.items[backend] = dataclasses.replace(spec, budget_seeds=n)
                        got = retrieve(store, q.text, backend=backend, budget_tokens=args.budget, query_vector=vec)
                        scores[backend][n].append(score(q.evidence, [sources.get(i) for i in got.store_ids]))
                    BACKENDS.items[backend] = spec
        print(f"{sample.id}: {time.perf_counter() - start:.0f} s", flush=True)
    rng = np.random.default_rng(0)
    boots = []
    for _ in range(args.resamples):
        w = np.zeros(len(questions))
        for v in np.unique(convs):
            idx = np.flatnonzero(convs == v)
            w += np.bincount(idx[rng.integers(0, len(idx), len(idx))], minlength=len(questions))
        boots.append(w)
    out: dict = {"smoke": True} if args.smoke else {}
    out |= {"budget_tokens": args.budget, "seeds": args.seeds, "conversations": ids, "questions": len(questions),
            "backends": {}}  # fmt: skip
    ones = np.ones(len(questions))
    for backend in args.backends:
        hit = np.array([[s["hit"] for s in scores[backend][n]] for n in args.seeds])
        rec = np.array([[s["recall"] for s in scores[backend][n]] for n in args.seeds])
        chosen = choose(hit, rec, ones, convs, np.unique(convs))
        lh, lr, folds = loo(hit, rec, ones, convs)
        bl = [loo(hit, rec, w, convs)[:2] for w in boots]
        bi = [
            (hit[c] @ w / w.sum(), rec[c] @ w / w.sum())
            for w in boots
            for c in [choose(hit, rec, w, convs, np.unique(convs))]
        ]
        ci = lambda xs: [round(float(x), 4) for x in np.percentile(xs, [2.5, 97.5])]  # noqa: E731
        out["backends"][backend] = {
            "per_seeds": {
                n: {"hit": round(float(hit[i].mean()), 4), "recall": round(float(rec[i].mean()), 4)}
                for i, n in enumerate(args.seeds)
            },  # fmt: skip
            "in_sample_choice": args.seeds[chosen],
            "in_sample": {
                "hit": round(float(hit[chosen].mean()), 4),
                "recall": round(float(rec[chosen].mean()), 4),
                "hit_ci95": ci([x[0] for x in bi]),
                "recall_ci95": ci([x[1] for x in bi]),
            },  # fmt: skip
            "loo": {
                "hit": round(lh, 4),
                "recall": round(lr, 4),
                "hit_ci95": ci([x[0] for x in bl]),
                "recall_ci95": ci([x[1] for x in bl]),
            },  # fmt: skip
            "fold_choices": {ids[f]: args.seeds[c] for f, c in enumerate(folds)},
        }
        e = out["backends"][backend]
        values = ", ".join(f"{n}: {v['hit']:.3f}/{v['recall']:.3f}" for n, v in e["per_seeds"].items())
        folds_shown = list(e["fold_choices"].values())
        print(f"{backend}: {values} | in-sample {e['in_sample_choice']} | LOO hit {lh:.3f} recall {lr:.3f} "
              f"folds {folds_shown}")  # fmt: skip
    out["seconds"] = round(time.perf_counter() - start, 1)
    report(out, args.out)


if __name__ == "__main__":
    main()
