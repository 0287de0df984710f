"""The answer-flow check's shifts on a red-team set, for a given responder: where to put ``answer_flow_threshold``.

    python benchmarks/calibrate_answer_flow.py --responder_model PATH_OR_HUB_ID [--responder_url URL]
        [--redteam tests/fixtures/redteam] [--max_rejected 0.01]
    python benchmarks/calibrate_answer_flow.py --smoke --out /tmp/calibration.json  # seconds: see below

``--smoke`` runs the same code with the project's tiny responder (``memstate.tiny_models``, built in a temporary
directory, unless ``--responder_model``) on every 40th state of each set; its JSON says ``"smoke": true``.

Every state of the set (``memstate.leak.redteam``) is scored by ``memstate.reward.answer_flow.AnswerFlowCheck`` with
this responder (in-process, or behind a vLLM server with ``--responder_url``): its shift with no memory shown. Reports
the shifts of the legitimate states and of the leaks (per kind), the lowest threshold that rejects at most
``--max_rejected`` of the legitimate states, and the share of leaks it rejects there — also among the leaks the leak
gate lets through on a second set (``--heldout``), the ones the check exists for. Run it with the production
responder (Qwen3-8B, a GPU) before trusting a threshold: the check measures the responder, so a threshold set on one
responder says nothing about another. Prints the figures and writes JSON.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from results_io import report

from memstate.leak import leaks_answer
from memstate.leak.redteam import load_redteam
from memstate.responders import ResponderConfig, make_responder
from memstate.reward.answer_flow import AnswerFlowCheck, quantile
from memstate.rules import parse_state

ROOT = Path(__file__).resolve().parent.parent


def shifts_of(check: AnswerFlowCheck, cases) -> list[tuple]:
    parsed = [(c, parse_state(c.state)) for c in cases]
    parsed = [(c, s) for c, s in parsed if hasattr(s, "rules")]
    shifts = check.shifts([c.instance for c, _ in parsed], [s.rules for _, s in parsed])
    return [(c, s) for (c, _), s in zip(parsed, shifts, strict=True) if s is not None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--responder_model", help="required (--smoke: the tiny responder unless given)")
    parser.add_argument("--responder_url", default=None)
    parser.add_argument("--redteam", default=str(ROOT / "tests/fixtures/redteam"))
    parser.add_argument("--heldout", default=str(ROOT / "benchmarks/redteam_heldout"))
    parser.add_argument("--max_rejected", type=float, default=0.01)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", help="In-process responder: float32, bfloat16 or float16.")
    parser.add_argument("--smoke", action="store_true", help="seconds, the same code: tiny responder, every 40th state")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/answer_flow_calibration.json"))
    args = parser.parse_args()
    if args.responder_model is None and not args.smoke:
        parser.error("the following arguments are required: --responder_model")
    with tempfile.TemporaryDirectory(prefix="calibrate_answer_flow_") as tmp:
        if args.responder_model is None:
            from memstate.tiny_models import build_tiny_models  # torch and transformers: only when it is needed

            args.responder_model = str(build_tiny_models(tmp)["responder"])
        run(args)


def run(args: argparse.Namespace) -> None:
    every = 40 if args.smoke else 1
    config = replace(ResponderConfig(), responder_model=args.responder_model, responder_url=args.responder_url)
    check = AnswerFlowCheck(make_responder(config, args.device, args.dtype, likelihood=True))  # log-probs only
    cases = load_redteam(args.redteam)[::every]
    scored = shifts_of(check, cases)
    legit = sorted(s for c, s in scored if not c.leak)
    # the lowest threshold (a shift strictly above it is rejected) with at most max_rejected of the legitimate states
    k = int(args.max_rejected * len(legit))
    threshold = legit[len(legit) - 1 - k] if legit else None
    by_kind = defaultdict(list)
    for c, s in scored:
        if c.leak:
            by_kind[c.kind].append(s)
    heldout = [(c, s) for c, s in shifts_of(check, load_redteam(args.heldout)[::every]) if c.leak]
    passed_gate = [s for c, s in heldout if not leaks_answer(c.state, c.instance)]
    results = {"smoke": True} if args.smoke else {}
    results |= {
        "responder": args.responder_model,
        "identity": check.responder.identity,
        "threshold_for_legitimate_rejected_at_most": {"max_rejected": args.max_rejected, "threshold": threshold},
        "legitimate": {"n": len(legit), "p50": quantile(legit, 0.5), "p99": quantile(legit, 0.99), "max": legit[-1]},
        "leaks_rejected_at_threshold": {
            kind: f"{sum(s > threshold for s in v)}/{len(v)}" for kind, v in sorted(by_kind.items())
        },
        "heldout_leaks_the_gate_passes": {
            "n": len(passed_gate),
            "rejected_at_threshold": sum(s > threshold for s in passed_gate),
        },
        "responder_prompts": check.calls,
    }
    report(results, args.out)


if __name__ == "__main__":
    main()
