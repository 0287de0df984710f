"""Every benchmark script still runs at HEAD: each takes ``--smoke`` (a size that finishes in seconds, the same code
path, its own checks on) and ``--out FILE``, and writes its JSON there with ``"smoke": true``. A script broken by a
change elsewhere (a renamed config key, a moved function) fails the default suite at the commit that breaks it, not
months later when someone reruns it. A new script without ``--smoke`` fails here too.

The GPU scripts (benchmarks/gpu/) have their own dry runs (tests/test_gpu_check.py). Seven cost minutes of CPU even
at their smallest and run in ``make check-all`` (marker ``slow``; docs/development.md, "CI budget"): the three that
train the sycophancy world's models (a responder, a warm-up, GRPO and four evaluations), the two that time GRPO
steps in several child processes (bench_threads, bench_train_step) and the two that start a real vLLM server from the
vLLM venv (bench_serve, bench_serve_load: ~3.5 min each beside CI's other lane)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
SHARED = {"results_io.py"}  # imported by the scripts, not one itself
# Each trains a world's models, times GRPO steps in child processes, or starts a vLLM server (needs `make vllm-venv`).
HEAVY = {
    "bench_sycophancy.py",
    "bench_sycophancy_seeds.py",
    "demo_spread.py",
    "bench_threads.py",
    "bench_train_step.py",
    "bench_serve.py",
    "bench_serve_load.py",
}
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name not in SHARED)


def results_snapshot() -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (BENCHMARKS / "results").glob("*")}


@pytest.mark.parametrize("script", [pytest.param(s, marks=pytest.mark.slow) if s in HEAVY else s for s in SCRIPTS])
def test_benchmark_runs_at_its_smoke_size(script, tmp_path):
    out = tmp_path / "result.json"
    before = results_snapshot()
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--smoke", "--out", str(out)],
        cwd=tmp_path,  # anything a script writes relative to its working directory stays in the test's folder
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"{script} --smoke failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    result = json.loads(out.read_text())
    assert result.get("smoke") is True, f"{script}: a smoke run's JSON must say so ('smoke': true)"
    assert f"benchmarks/{script} --smoke" in result.get("command", ""), "written through results_io.report"
    # a smoke run never overwrites the committed figures
    assert results_snapshot() == before, f"{script} --smoke wrote under benchmarks/results/"
