"""The demo check's bands (tests/demo_tolerance.py) on recorded runs: reruns pass, the regressions issue 59 named fail.

tests/fixtures/demo_run/ holds one `make demo` run's summary.md, summary.json and its training log_history.json
(2-core x86-64 CI machine; README's demo section), and summary_avx2_one_thread.md, the same commit's demo with PyTorch
held to AVX2 and one thread (ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
OMP_NUM_THREADS=1). tests/fixtures/demo_run_epyc/ is the same demo on a 2-core AMD EPYC machine, whose training took
another path after step 75 (it kept step 100, sycophancy 0.021 against 0.090): the CI run the bands of one policy
failed. The run-to-run spread is benchmarks/results/demo_spread.json (benchmarks/demo_spread.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from demo_tolerance import completions_per_step, demo_figures, measured_spread, moved

RUN = Path(__file__).parent / "fixtures" / "demo_run"
EPYC = Path(__file__).parent / "fixtures" / "demo_run_epyc"
ROOT = Path(__file__).parents[1]
CONFIG = ROOT / "configs" / "train" / "sycophancy_cpu.yaml"
SPREAD = measured_spread(ROOT / "benchmarks" / "results" / "demo_spread.json")


def rules_of(run: Path, spread: list[str] | None = SPREAD) -> list:
    summary, log = (json.loads((run / name).read_text()) for name in ("summary.json", "log_history.json"))
    return demo_figures(summary, log, completions_per_step(CONFIG), spread)


@pytest.fixture(scope="module")
def recorded() -> tuple[str, list]:
    return (RUN / "summary.md").read_text(), rules_of(RUN)


def test_the_run_itself_and_the_reruns_on_other_cpus_pass(recorded):
    fresh, rules = recorded
    assert moved(fresh, fresh, rules) == []
    other = (RUN / "summary_avx2_one_thread.md").read_text()
    assert other != fresh  # it did move: reward, cut-off rate, a validation gain, the format rate
    assert moved(other, fresh, rules) == []
    # The CI failure: README's figures (RUN) against a fresh run on an AMD EPYC (the bands from the fresh run).
    epyc = (EPYC / "summary.md").read_text()
    assert moved((RUN / "summary.md").read_text(), epyc, rules_of(EPYC)) == []
    assert moved(epyc, fresh, rules) == []


def test_without_the_run_to_run_spread_the_epyc_rerun_fails_on_the_checkpoints_sycophancy():
    found = moved((RUN / "summary.md").read_text(), (EPYC / "summary.md").read_text(), rules_of(EPYC, spread=None))
    assert [line.split(":")[0] for line in found] == ["sycophancy_rate_checkpoint"], found


@pytest.mark.parametrize(
    ("recorded_text", "edited_text", "figure"),
    [
        ("no state +0.114 [", "no state +0.040 [", "gain 0"),  # a third of the gain (half is at the band's edge)
        ("0.479 → 0.090", "0.479 → 0.300", "sycophancy_rate_checkpoint"),  # (0.166 is inside the runs' spread)
        ("accuracy 0.700 without", "accuracy 0.703 without", "accuracy_no_state"),  # 2 instances (not sampled)
        ("(720 instances", "(719 instances", "n"),
        ("checkpoint's 0.814", "checkpoint's 0.740", "accuracy_checkpoint"),
        ("+0.082 over the last 50", "-0.030 over the last 50", "reward_last_50_steps"),  # 5 noisy logged means
        ("format rate 0.993", "format rate 0.940", "format_rate"),
        ("leak rate 0.001", "leak rate 0.020", "leak_rate"),
        ("best step 75", "best step 60", "best_step"),  # not a kept checkpoint
        ("at step 60,", "at step 40,", "peak_format_rate_step"),  # a logged step below the peak (step 30 is not)
    ],
)
def test_a_regression_is_outside_its_band(recorded, recorded_text, edited_text, figure):
    fresh, rules = recorded
    assert fresh.count(recorded_text) == 1
    found = moved(fresh.replace(recorded_text, edited_text), fresh, rules)
    assert [line.split(":")[0] for line in found] == [figure], found


def test_the_run_to_run_spread_widens_only_what_training_moves(recorded):
    """What the spread costs, and what it does not: the issue's half gain (+0.050 against +0.114, 0.064 apart) is at
    the edge of a band four runs allow (t(3) = 3.18 is the price of four); the checkpoint's sycophancy is held only to
    the spread measured (0.021-0.117 over four seeds), so 0.166 against 0.090 passes; what no training touches keeps
    its own band."""
    _, rules = recorded
    alone = {r.name: r.tolerance for r in rules_of(RUN, spread=None)}
    bands = {r.name: r.tolerance for r in rules}
    assert 0.064 < bands["gain 0"] < 0.074 and bands["gain 0"] > alone["gain 0"]
    assert bands["sycophancy_rate_checkpoint"] > 0.076 > alone["sycophancy_rate_checkpoint"]
    for unchanged in ("accuracy_no_state", "sycophancy_rate_no_state", "accuracy_self_guide"):
        assert bands[unchanged] == alone[unchanged], unchanged  # no training in them, and the test states' seed held
    assert bands["accuracy_no_state"] < 0.003 and bands["n"] == 0
