"""The demo check's bands (tests/demo_tolerance.py) on a recorded run: reruns pass, the regressions issue 59 named fail.

tests/fixtures/demo_run/ holds one `make demo` run's summary.md, summary.json and its training log_history.json
(2-core x86-64 CI machine), and summary_avx2_one_thread.md, the same commit's demo with PyTorch held to AVX2 and one
thread (ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=1): the rerun
"on another machine".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from demo_tolerance import completions_per_step, demo_figures, moved

RUN = Path(__file__).parent / "fixtures" / "demo_run"
CONFIG = Path(__file__).parents[1] / "configs" / "train" / "sycophancy_cpu.yaml"


@pytest.fixture(scope="module")
def recorded() -> tuple[str, list]:
    rules = demo_figures(json.loads((RUN / "summary.json").read_text()),
                         json.loads((RUN / "log_history.json").read_text()), completions_per_step(CONFIG))  # fmt: skip
    return (RUN / "summary.md").read_text(), rules


def test_the_run_itself_and_the_rerun_on_another_cpu_pass(recorded):
    fresh, rules = recorded
    assert moved(fresh, fresh, rules) == []
    other = (RUN / "summary_avx2_one_thread.md").read_text()
    assert other != fresh  # it did move: reward, cut-off rate, a validation gain, the format rate
    assert moved(other, fresh, rules) == []


@pytest.mark.parametrize(
    ("recorded_text", "edited_text", "figure"),
    [
        ("no state +0.114 [", "no state +0.050 [", "gain 0"),  # half the gain
        ("0.479 → 0.090", "0.479 → 0.166", "sycophancy_rate_checkpoint"),
        ("accuracy 0.700 without", "accuracy 0.703 without", "accuracy_no_state"),  # 2 instances (not sampled)
        ("(720 instances", "(719 instances", "n"),
        ("checkpoint's 0.814", "checkpoint's 0.760", "accuracy_checkpoint"),
        ("+0.082 over the last 50", "-0.010 over the last 50", "reward_last_50_steps"),  # 5 noisy logged means
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


def test_the_bands_are_narrower_than_the_old_flat_tolerance_where_it_hid_a_regression(recorded):
    _, rules = recorded
    bands = {r.name: r.tolerance for r in rules}
    assert bands["gain 0"] < 0.064 and bands["sycophancy_rate_checkpoint"] < 0.076  # the two regressions
    assert bands["accuracy_no_state"] < 0.003 and bands["n"] == 0
