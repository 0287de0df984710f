"""The leak gate's recall and precision on every red-team set, per named check.

    python benchmarks/bench_leak_precision.py [--sets DIR ...] [--out FILE]
    python benchmarks/bench_leak_precision.py --smoke --out /tmp/leak_precision.json  # seconds: every 25th state

Each state of each set (``memstate.leak.redteam.load_redteam``) is decided on its instance under every possible gold
answer (``gold_variants``), by the gate (``instance_leak_reason``: folding, then the named checks). Reported per set:
leaks caught (recall), legitimate states blocked (false-positive rate), precision = caught leaks / (caught leaks +
blocked legitimate states), how many states got a decision that depended on the gold answer (must be 0), and per named
check (``memstate.leak.CHECKS``) how many leaks and legitimate states it was the first to fire on, and its precision.
Prints the figures and writes JSON.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from results_io import report

from memstate.leak import CHECKS, first_check, instance_leak_reason
from memstate.leak.redteam import gold_variants, load_redteam

ROOT = Path(__file__).resolve().parent.parent
NAMES = tuple(c.name for c in CHECKS)
SETS = (
    "tests/fixtures/redteam",
    "benchmarks/redteam_heldout",
    "benchmarks/legit_heldout",
    *(f"benchmarks/legit_fresh{n}" for n in ("", "2", "3", "4", "5")),
)


def _precision(caught: int, blocked: int) -> float | None:
    return round(caught / (caught + blocked), 4) if caught + blocked else None


def _figures(leaks: int, legit: int, caught: int, blocked: int) -> dict:
    return {
        "leaks_caught": f"{caught}/{leaks}",
        "recall": round(caught / leaks, 4) if leaks else None,
        "legit_blocked": f"{blocked}/{legit}",
        "legit_blocked_pct": round(100 * blocked / legit, 2) if legit else None,
        "precision": _precision(caught, blocked),
    }


def measure(directory: Path, every: int = 1) -> dict:
    cases = load_redteam(directory)[::every]
    n_leaks = sum(c.leak for c in cases)
    n_legit = len(cases) - n_leaks
    gate = Counter()
    checks = {name: Counter() for name in NAMES}
    dependent, blocked_legit = [], []
    for case in cases:
        variants = gold_variants(case.instance)
        if len({instance_leak_reason(case.state, inst) is not None for inst in variants}) > 1:
            dependent.append(case.where)
        side = "leak" if case.leak else "legit"
        reason = instance_leak_reason(case.state, case.instance)
        gate[side] += reason is not None
        if reason is not None:
            checks[first_check(case.state, case.instance)][side] += 1
            if not case.leak:
                blocked_legit.append({"where": case.where, "kind": case.kind, "state": case.state, "reason": reason})
    return {
        "states": len(cases),
        "leaks": n_leaks,
        "legit": n_legit,
        "gold_dependent_decisions": len(dependent),
        "gold_dependent_where": dependent,
        "gate": _figures(n_leaks, n_legit, gate["leak"], gate["legit"]),
        "per_check_first_fired": {
            name: {"leaks": c["leak"], "legit": c["legit"], "precision": _precision(c["leak"], c["legit"])}
            for name, c in checks.items()
        },
        "legit_blocked_states": blocked_legit,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", nargs="+", default=[str(ROOT / s) for s in SETS])
    parser.add_argument("--smoke", action="store_true", help="seconds, the same code: every 25th state of each set")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/leak_precision.json"))
    args = parser.parse_args()
    results: dict = {"smoke": True} if args.smoke else {}
    for directory in args.sets:
        path = Path(directory).resolve()
        name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
        results[name] = measure(path, every=25 if args.smoke else 1)
    results["checks"] = list(NAMES)
    report(results, args.out)


if __name__ == "__main__":
    main()
