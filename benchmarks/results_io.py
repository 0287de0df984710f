"""Shared by the benchmarks: print the figures and write them as JSON, with the command, time and load behind them."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def command_line() -> str:
    """This process's command as a user at the repository root would type it."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return " ".join(["python", str(shown), *sys.argv[1:]])


def default_out(name: str, smoke: bool) -> str:
    """Where a benchmark writes ``name`` when ``--out`` is not given: the committed results, or for a ``--smoke`` run
    (whose figures are no measurement) the system's temporary directory."""
    return str((Path(tempfile.gettempdir()) if smoke else ROOT / "benchmarks" / "results") / name)


def report(results: dict, out: str | Path) -> None:
    """Print ``results`` and write them to ``out``, led by the command that ran and when and under what load it wrote
    them (a script that records its own, e.g. the load before its servers started, keeps them)."""
    made = {"command": command_line(), "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_avg_at_write": [round(x, 2) for x in os.getloadavg()]}  # fmt: skip
    results = {key: value for key, value in made.items() if key not in results} | results
    print(json.dumps(results, indent=2))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {out}")
