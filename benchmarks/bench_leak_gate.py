"""What the leak gate costs per state (``memstate.leak.leaks_answer``), on this machine's cores.

    python benchmarks/bench_leak_gate.py [--redteam tests/fixtures/redteam] [--repeats 3]

Every state of the red-team set is decided on its instance: the lexical rules alone (``lexical_reason``), and the
whole gate (folding, lexical rules, then the MiniLM semantic check on the states the rules pass) with the embedding
cache emptied before each state, so each pays for embedding its own sentences as a new GRPO state would (the
candidates' and memories' embeddings stay cached, as they do across a group of G states). Reports the one-off costs
(loading the embedder; the confusables table and stop-word lists) and p50 / p90 / max per state, over all states and
over the legitimate ones (which reach the semantic check), each state timed ``--repeats`` times. Prints the figures
and writes JSON.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

from results_io import report

from memstate.leak import fold, lexical_reason, semantic
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
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/bench_leak_gate.json"))
    args = parser.parse_args()
    cases = load_redteam(args.redteam)

    started = time.perf_counter()
    semantic.embed(["warm-up sentence"])  # loads MiniLM once
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    first = cases[0].instance
    lexical_reason(cases[0].state, first.candidates, first.answer_kind, first.answer, first.question, [])
    rules_load_s = time.perf_counter() - started  # the confusables table and spaCy's stop-word lists, once

    lexical_ms, gate_ms, semantic_ms = [], [], []
    for _ in range(args.repeats):
        for c in cases:
            inst = c.instance
            facts = [f.text for f in inst.facts]
            t0 = time.perf_counter()
            lexical_reason(c.state, inst.candidates, inst.answer_kind, inst.answer, inst.question, facts)
            lexical_ms.append(1000 * (time.perf_counter() - t0))
            for sentence in semantic.sentences(fold(c.state)):  # this state's own sentences are new
                semantic.embed._cache.pop(sentence, None)
            semantic.embed([*inst.candidates, *facts, *semantic.LEGITIMATE])  # cached per group, as in training
            t0 = time.perf_counter()
            gate(c.state, inst)
            gate_ms.append(1000 * (time.perf_counter() - t0))
            if not c.leak:  # the rules pass it, so the semantic check runs: what a well-behaved policy's state costs
                semantic_ms.append(gate_ms[-1])
    results = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "states": len(cases),
        "repeats": args.repeats,
        "embedder_load_s": round(load_s, 2),
        "rules_load_s": round(rules_load_s, 2),
        "lexical_rules": percentiles(lexical_ms),
        "whole_gate_new_state": percentiles(gate_ms),
        "whole_gate_legitimate_new_state": percentiles(semantic_ms),
    }
    report(results, args.out)


if __name__ == "__main__":
    main()
