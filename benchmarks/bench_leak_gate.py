"""What the leak gate costs per state (``memstate.leak.leaks_answer``), on this machine's cores.

    python benchmarks/bench_leak_gate.py [--redteam tests/fixtures/redteam] [--repeats 3]
    python benchmarks/bench_leak_gate.py --smoke --out /tmp/bench_leak_gate.json  # seconds: every 20th state, once

Every state of the red-team set is decided on its instance, each timed ``--repeats`` times. Reports the one-off cost
(the confusables table and spaCy's stop-word lists, on first use) and p50 / p90 / max per state, over all states and
over the legitimate ones (which run every check). Prints the figures and writes JSON.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

from results_io import report

from memstate.leak import leaks_answer as gate
from memstate.leak.redteam import load_redteam

ROOT = Path(__file__).resolve().parent.parent


def percentiles(ms: list[float]) -> dict:
    ms = sorted(ms)
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 3),
        "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 3),
        "max_ms": round(ms[-1], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redteam", default=str(ROOT / "tests/fixtures/redteam"))
    parser.add_argument("--repeats", type=int, default=None, help="default 3 (--smoke: 1)")
    parser.add_argument("--smoke", action="store_true", help="seconds, the same code: every 20th state, once")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/bench_leak_gate.json"))
    args = parser.parse_args()
    args.repeats = args.repeats or (1 if args.smoke else 3)
    cases = load_redteam(args.redteam)
    if args.smoke:
        cases = cases[::20]

    started = time.perf_counter()
    gate(cases[0].state, cases[0].instance)
    rules_load_s = time.perf_counter() - started  # the confusables table and spaCy's stop-word lists, once

    gate_ms, legit_ms = [], []
    for _ in range(args.repeats):
        for c in cases:
            t0 = time.perf_counter()
            gate(c.state, c.instance)
            gate_ms.append(1000 * (time.perf_counter() - t0))
            if not c.leak:  # every check runs on it: what a well-behaved policy's state costs
                legit_ms.append(gate_ms[-1])
    results = {"smoke": True} if args.smoke else {}
    results |= {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "states": len(cases),
        "repeats": args.repeats,
        "rules_load_s": round(rules_load_s, 2),
        "gate": percentiles(gate_ms),
        "gate_legitimate": percentiles(legit_ms),
    }
    report(results, args.out)


if __name__ == "__main__":
    main()
