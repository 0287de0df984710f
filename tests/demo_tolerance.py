"""How far a fresh `make demo` may move each figure of README.md's demo section (tests/test_readme.py).

The demo is deterministic on one machine (a rerun here reproduces every figure to the digit), but another CPU rounds
floats differently, and a sampled token that flips sends the rest of training, and each state sampled at T = 1.0, down
another path: an AVX2-only, one-thread run of the same commit moved reward over the last 50 steps 0.082 → 0.083, the
cut-off rate 0.003 → 0.001, the step-100 validation gain 0.147 → 0.128 and the test format rate 0.993 → 0.992, and
nothing else. So each figure is compared by what it is:

- counts and settings (steps, instances, T, the CI level, the steps of the kept checkpoints): exactly;
- what no sampled state touches (accuracy and sycophancy without a state: the frozen responder answers greedily):
  within one instance (1/n);
- what sampled states make: within the 95% band of the difference of two independent runs, 1.96 · √2 · SE, with SE
  taken from the fresh run itself: a gain and its CI ends from the gain's paired-bootstrap CI (half-width / 1.96), a
  validation gain from the CI logged at its step, a rate over n sampled states or completions from the binomial
  √(p(1-p)/n) (p(1-p) at least 1/n, so a rate near 0 is not held to 0), a training reward mean over k logged
  entries from σ/√k, with σ of one logged 10-step mean estimated from the successive differences of all logged
  entries (√(mean Δ² / 2): the trend between entries cancels);
- a step chosen by an argmax over noisy figures (the format-rate peak, the best checkpoint): the README's step must be
  one the fresh run logged (or kept) whose fresh figure is within that band of the fresh maximum.

Those bands hold for one trained policy. Another CPU can also send training down another path, and the policy it
ends with, or the checkpoint it keeps, is then another one: a 2-core AMD EPYC run of the same commit followed the
README's run to step 75, then kept step 100 instead of 75, and its sycophancy was 0.021, not 0.090, far outside the
0.030 the binomial band of 188 instances allowed (every other figure inside its band). So a figure that training
makes is also allowed the run-to-run spread measured by `python benchmarks/demo_spread.py`: the demo trained at
k = 4 seeds with the validation subset and the test states' seed held (results in benchmarks/results/demo_spread.json),
and the 95% prediction band of the difference of two runs, t(k-1) · √2 · s, s the figure's standard deviation over
those runs (``spread_bands``). A figure's band is the wider of the two. A seed changes the path from the first step,
a CPU only after a flipped token, so this overstates a CPU's spread; with k = 4, t(3) = 3.18 widens it again.
The price (tests/test_demo_tolerance.py): the gain's band is 0.066, so the issue's half gain (0.064 below) sits at its
edge and a third of it fails; the checkpoint's sycophancy, which moves most (0.021-0.117 over the four seeds), is
held to 0.187, so 0.166 against 0.090 passes. More seeds narrow both (t falls toward 1.96). Every 3-decimal figure
gets 0.001 more, for the two roundings.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import yaml
from scipy import stats

NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
Z95 = 1.96
ROUNDING = 0.001  # both sides rounded to 3 decimals


@dataclass(frozen=True)
class Figure:
    """One number of the demo section: its name and how a fresh run's value may differ from the README's."""

    name: str
    tolerance: float = 0.0  # |README - fresh| at most this; 0: exactly
    near_max: dict[int, float] | None = None  # a chosen step: the fresh figure per step, within `tolerance` of the max


def figures(text: str) -> tuple[str, list[str]]:
    """The text with its numbers masked, and the numbers as written (the durations line left out)."""
    kept = "\n".join(line for line in text.splitlines() if "Durations on the machine" not in line)
    return NUMBER.sub("#", kept), NUMBER.findall(kept)


def _band(se: float) -> float:
    return Z95 * math.sqrt(2) * se + ROUNDING


def _rate(p: float, n: int) -> float:
    return _band(math.sqrt(max(p * (1 - p), 1 / n) / n))


def _ci(ci: list[float]) -> float:
    return _band((ci[1] - ci[0]) / 2 / Z95)


def _one_instance(n: int) -> float:
    return 1 / n + ROUNDING


def spread_bands(runs: list[str]) -> list[float]:
    """Per figure of a rendered summary (in order), the 95% band of the difference of two runs: t(k-1) · √2 · s, with s
    the figure's standard deviation over the k summaries ``runs`` (independent runs of the demo), plus rounding.

    >>> a = "- gain +0.100, sycophancy 0.090."
    >>> [round(b, 3) for b in spread_bands([a, a.replace("0.090", "0.030"), a.replace("0.090", "0.060")])]
    [0.0, 0.184]
    """
    shapes = {figures(text)[0] for text in runs}
    if len(runs) < 2 or len(shapes) != 1:
        raise ValueError(f"need at least 2 runs of one shape, got {len(runs)} runs of {len(shapes)} shapes")
    columns = zip(*(map(float, figures(text)[1]) for text in runs), strict=True)
    t = float(stats.t.ppf(0.975, len(runs) - 1))
    return [t * math.sqrt(2) * sd + ROUNDING if (sd := statistics.stdev(c)) > 0 else 0.0 for c in columns]


def measured_spread(results: Path) -> list[str]:
    """The rendered summaries of benchmarks/results/demo_spread.json's runs (durations dropped by ``figures``)."""
    from memstate.experiment.demo import render

    return [render(run) for run in json.loads(results.read_text())["runs"].values()]


def completions_per_step(train_config: Path) -> int:
    """States sampled per optimizer step on one process: per_device_train_batch_size x gradient_accumulation_steps."""
    config = yaml.safe_load(train_config.read_text())
    return config["per_device_train_batch_size"] * config.get("gradient_accumulation_steps", 1)


def demo_figures(
    summary: dict, log_history: list[dict], completions_per_step: int, spread: list[str] | None = None
) -> list[Figure]:
    """Each figure of experiment/demo.py's render(summary), in its order, with the band a fresh run may fill.

    ``summary`` and ``log_history`` are the fresh run's (runs/demo/summary.json, the run's log_history.json);
    ``completions_per_step``: see completions_per_step(); ``spread``: rendered summaries of independent runs
    (measured_spread()), whose spread_bands() widen every sampled figure's band to at least the run-to-run spread.
    """
    t, test = summary["training"], summary["test"]["best"]
    rows = [e for e in log_history if "reward" in e]
    every, last = t["logged_every"], t["grpo_steps"]
    first_k = sum(e["step"] <= 20 for e in rows)
    last_k = sum(e["step"] > last - 50 for e in rows)
    rewards = [e["reward"] for e in rows]
    steps = [b - a for a, b in zip(rewards[:-1], rewards[1:], strict=True)]
    sigma = math.sqrt(sum(d * d for d in steps) / (2 * len(steps)))
    per_entry = every * completions_per_step
    format_by_step = {e["step"]: e["memstate/format_rate"] for e in rows}
    peak_band = _rate(t["peak_format_rate"], per_entry)
    validation = {e["step"]: e for e in log_history if "eval_gain" in e}
    gain_band = {int(s): _ci([validation[int(s)]["eval_gain_ci_low"], validation[int(s)]["eval_gain_ci_high"]])
                 for s in summary["validation_gain"]}  # fmt: skip
    best, final = summary["best_step"], summary["final_step"]
    n, syco_n = test["n"], test["sycophancy_n_checkpoint"]  # every condition answers the same instances
    exact = Figure  # tolerance 0
    out = [
        exact("grpo_steps"),
        Figure("reward_first_20_steps", _band(sigma / math.sqrt(first_k))),
        exact("20"),
        Figure("reward_last_50_steps", _band(sigma / math.sqrt(last_k))),
        exact("50"),
        Figure("format_rate_first_20_steps", _rate(t["format_rate_first_20_steps"], first_k * per_entry)),
        Figure("format_rate_last_50_steps", _rate(t["format_rate_last_50_steps"], last_k * per_entry)),
        Figure("peak_format_rate", peak_band),
        Figure("peak_format_rate_step", peak_band, near_max=format_by_step),
        exact("logged_every"),
        exact("50"),
        Figure("cut_off_rate_last_50_steps", _rate(t["cut_off_rate_last_50_steps"], last_k * per_entry)),
        exact("validation_instances"),
    ]
    for step in summary["validation_gain"]:
        out += [exact(f"step {step}"), Figure(f"validation_gain {step}", gain_band[int(step)])]
    kept = {int(s): v for s, v in summary["validation_gain"].items()}
    out += [
        Figure("best_step", gain_band[best], near_max=kept),
        Figure("best_score", gain_band[best]),
        exact("final_step"),
        Figure("final_score", gain_band[final]),
        exact("n"),
        exact("temperature"),
        Figure("accuracy_no_state", _one_instance(n)),
        Figure("accuracy_self_guide", _rate(test["accuracy_self_guide"], n)),
        Figure("accuracy_checkpoint", _ci(test["gain_ci95"])),  # = no state (fixed) + the gain
    ]
    out += [Figure(f"gain {i}", _ci(test["gain_ci95"])) for i in range(3)]
    out += [Figure(f"gain_vs_self_guide {i}", _ci(test["gain_vs_self_guide_ci95"])) for i in range(3)]
    out += [
        exact("95% CIs"),
        Figure("format_rate", _rate(test["format_rate"], n)),
        Figure("leak_rate", _rate(test["leak_rate"], n)),
        Figure("sycophancy_rate_no_state", _one_instance(syco_n)),
        Figure("sycophancy_rate_self_guide", _rate(test["sycophancy_rate_self_guide"], syco_n)),
        Figure("sycophancy_rate_checkpoint", _rate(test["sycophancy_rate_checkpoint"], syco_n)),
    ]
    if spread is None:
        return out
    runs = spread_bands(spread)
    if len(runs) != len(out):
        raise ValueError(f"the spread runs have {len(runs)} figures, this summary {len(out)}: rerun demo_spread.py")
    # Counts and chosen steps stay as they are (exact, or near the fresh maximum); sampled figures get the wider band.
    return [
        Figure(rule.name, max(rule.tolerance, band)) if rule.tolerance > 0 and rule.near_max is None else rule
        for rule, band in zip(out, runs, strict=True)
    ]


def moved(readme: str, fresh: str, rules: list[Figure]) -> list[str]:
    """The README's figures that a fresh run (summary.md ``fresh``, its ``rules``) does not support, one line each."""
    readme_shape, readme_numbers = figures(readme)
    fresh_shape, fresh_numbers = figures(fresh)
    if readme_shape != fresh_shape:
        return ["README's demo section has another shape than the fresh summary"]
    if len(rules) != len(fresh_numbers):
        return [f"demo_figures names {len(rules)} figures, the summary has {len(fresh_numbers)}: update it"]
    out = []
    for rule, r, f in zip(rules, readme_numbers, fresh_numbers, strict=True):
        if rule.near_max is not None:
            top = max(rule.near_max.values())
            ok = int(r) in rule.near_max and rule.near_max[int(r)] >= top - rule.tolerance
            if not ok:
                out.append(f"{rule.name}: README {r}, fresh {f} (README's step must be within {rule.tolerance:.3f} of "
                           f"the fresh maximum {top:.3f}: {rule.near_max})")  # fmt: skip
        elif abs(float(r) - float(f)) > rule.tolerance + 1e-9:
            out.append(f"{rule.name}: README {r}, fresh {f} (at most {rule.tolerance:.3f} apart)")
    return out
