"""``training_curves.png``: reward, gain (training and validation), format/leak rates, KL and completion length over
training steps."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on training nodes
import matplotlib.pyplot as plt  # noqa: E402

PANELS = (
    ("reward", ("reward",)),
    ("counterfactual gain", ("memstate/gain_mean",)),
    ("validation gain (95% CI)", ("eval_gain", "eval_gain_ci_low", "eval_gain_ci_high")),
    ("validation accuracy", ("eval_accuracy_no_state", "eval_accuracy_state")),
    ("format / leak rate", ("memstate/format_rate", "memstate/leak_rate")),
    ("KL to reference", ("kl",)),
    ("completion length (tokens)", ("completions/mean_length",)),
)


def plot_training_curves(log_history: list[dict], path: str | Path) -> Path:
    """Plot the logged metrics (each panel shows what was logged; a metric never logged leaves its panel empty)."""
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.2))
    for ax, (title, keys) in zip(axes, PANELS, strict=True):
        for key in keys:
            points = [(e["step"], e[key]) for e in log_history if key in e]
            if points:
                ax.plot(*zip(*points, strict=True), marker=".", label=key.split("/")[-1])
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(keys) > 1:
            ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
