"""Shared by the benchmarks: print the figures and write them as JSON."""

from __future__ import annotations

import json
from pathlib import Path


def report(results: dict, out: str | Path) -> None:
    print(json.dumps(results, indent=2))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {out}")
