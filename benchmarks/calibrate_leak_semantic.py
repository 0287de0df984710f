"""Calibrate the leak gate's semantic check (``memstate.leak.semantic``) on a red-team set, and measure the gate.

    python benchmarks/calibrate_leak_semantic.py [--redteam tests/fixtures/redteam] [--heldout DIR ...]

For each state of the red-team set (``memstate.leak.redteam``) the semantic features are computed once: label
instances (similarity to the closest verdict statement, margin over the closest legitimate rule), choice instances
(similarity to the closest option, specificity to it, lead over the closest memory). Thresholds are chosen on a grid:
the most leaks rejected by the semantic check alone with no legitimate state rejected, ties to the higher thresholds;
then each threshold is moved up by 0.04 (a safety step: a legitimate sentence just past the boundary costs the policy
a -1, and the red team's legitimate states are few). Reported per set: the semantic check alone (precision, recall,
per kind) and the whole gate (lexical + semantic: leaks rejected per kind, legitimate states rejected). A held-out
set (``--heldout``: one the gate was not tuned to) gives the honest figures. Prints them and writes JSON.
"""

from __future__ import annotations

import argparse
import itertools
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import numpy as np
from results_io import report

from memstate.leak import lexical_reason
from memstate.leak.normalize import fold
from memstate.leak.redteam import Case, load_redteam
from memstate.leak.semantic import _QUESTION, Thresholds, label_scores, option_scores, semantic_reason, sentences

ROOT = Path(__file__).resolve().parent.parent
STEP = 0.02
SAFETY = 0.04


def features(case: Case) -> tuple | None:
    inst = case.instance
    sents = [x for x in sentences(fold(case.state)) if not _QUESTION.search(x)]
    if not sents:
        return None
    if inst.answer_kind == "label":
        return label_scores(sents, inst.candidates)[:2]
    return option_scores(sents, inst.candidates, [f.text for f in inst.facts])[:3]


def best_thresholds(points: list[tuple[tuple, bool]], grids: list[np.ndarray]) -> tuple[tuple, int]:
    """The grid point with the most leaks at or above every threshold and no legitimate state there (ties: higher)."""
    best, best_hits = None, -1
    for t in itertools.product(*grids):
        above = [leak for f, leak in points if all(x >= y for x, y in zip(f, t, strict=True))]
        if any(not leak for leak in above):
            continue
        if len(above) >= best_hits:
            best, best_hits = t, len(above)
    return tuple(round(x + SAFETY, 2) for x in best), best_hits


def gate_figures(cases: list[Case], thresholds: Thresholds) -> dict:
    sem_hits, lex_hits, gate_hits, totals, blocked, legit_total = Counter(), Counter(), Counter(), Counter(), [], 0
    sem_fp = 0
    for c in cases:
        inst = c.instance
        facts = [f.text for f in inst.facts]
        lex = lexical_reason(c.state, inst.candidates, inst.answer_kind, inst.answer, inst.question, facts)
        sem = semantic_reason(fold(c.state), inst.candidates, inst.answer_kind, facts, thresholds)
        if c.leak:
            totals[c.kind] += 1
            sem_hits[c.kind] += bool(sem)
            lex_hits[c.kind] += bool(lex)
            gate_hits[c.kind] += bool(lex or sem)
        else:
            legit_total += 1
            sem_fp += bool(sem)
            if lex or sem:
                blocked.append({"where": c.where, "state": c.state, "reason": lex or sem})
    n_leaks = sum(totals.values())
    sem_tp = sum(sem_hits.values())
    return {
        "leaks": n_leaks,
        "legitimate": legit_total,
        "semantic_alone": {
            "recall": round(sem_tp / n_leaks, 3) if n_leaks else None,
            "precision": round(sem_tp / (sem_tp + sem_fp), 3) if sem_tp + sem_fp else None,
            "rejected_legitimate": sem_fp,
            "recall_per_kind": {k: f"{sem_hits[k]}/{totals[k]}" for k in sorted(totals)},
        },
        "lexical_alone_rejected": f"{sum(lex_hits.values())}/{n_leaks}",
        "gate": {
            "leaks_rejected": f"{sum(gate_hits.values())}/{n_leaks}",
            "leaks_rejected_rate": round(sum(gate_hits.values()) / n_leaks, 3) if n_leaks else None,
            "per_kind": {k: f"{gate_hits[k]}/{totals[k]}" for k in sorted(totals)},
            "legitimate_rejected": f"{len(blocked)}/{legit_total}",
            "legitimate_rejected_states": blocked,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redteam", default=str(ROOT / "tests/fixtures/redteam"))
    parser.add_argument("--heldout", nargs="*", default=[], help="Red-team sets the gate was not tuned to.")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/leak_semantic_calibration.json"))
    args = parser.parse_args()

    cases = load_redteam(args.redteam)
    label_points, choice_points = [], []
    for c in cases:
        f = features(c)
        if f is not None:
            (label_points if c.instance.answer_kind == "label" else choice_points).append((f, c.leak))
    grid = np.round(np.arange(0.30, 0.96, STEP), 2)
    margin = np.round(np.arange(0.0, 0.41, STEP), 2)
    (label_sim, label_margin), _ = best_thresholds(label_points, [grid, margin])
    (opt_sim, opt_spec, opt_mem), _ = best_thresholds(choice_points, [grid, margin, margin])
    thresholds = Thresholds(label_sim, label_margin, opt_sim, opt_spec, opt_mem)
    results = {
        "calibrated_on": str(Path(args.redteam).resolve().relative_to(ROOT))
        if ROOT in Path(args.redteam).resolve().parents
        else args.redteam,
        "rule": "most leaks rejected by the semantic check alone with no legitimate state rejected, then +0.04 each",
        "thresholds": asdict(thresholds),
        "in_code": asdict(Thresholds()),
        "calibration_set": gate_figures(cases, thresholds),
        "held_out": {d: gate_figures(load_redteam(d), thresholds) for d in args.heldout},
    }
    report(results, args.out)


if __name__ == "__main__":
    main()
