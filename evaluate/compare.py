"""``memstate eval compare RUN_A RUN_B …``: evaluation runs side by side, as a Markdown table and a bar chart.

Each RUN is a report dir (or its ``report.json``) written by ``memstate eval``. Runs are compared on what they have
in common: the overall metrics of every condition, and per task the checkpoint's accuracy and gain over no state
with their 95% CIs. Runs on different data (manifest hash) or prompts are flagged, not refused.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from memstate.errors import ConfigError, InputError, InputNotFound
from memstate.evaluate.report import CONDITION_COLUMNS, _ci, _fmt


def load_report(path: str | Path) -> dict:
    path = Path(path)
    file = path / "report.json" if path.is_dir() else path
    if not file.is_file():
        raise InputNotFound(f"{path}: no report.json (run `memstate eval` first)")
    try:
        report = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{file}: not a memstate eval report (not JSON: {e})") from None
    for key in ("checkpoint", "conditions", "metrics"):
        if not isinstance(report, dict) or key not in report:
            raise InputError(f"{file}: not a memstate eval report (no '{key}')")
    report["_path"] = str(file.parent)
    return report


def run_name(report: dict) -> str:
    return f"{Path(report['checkpoint']).parent.name}/{Path(report['checkpoint']).name}"


def compare_markdown(reports: list[dict]) -> str:
    names = [run_name(r) for r in reports]
    lines = ["# Evaluation runs compared", ""]
    for name, r in zip(names, reports, strict=True):
        lines.append(f"- **{name}**: `{r['_path']}` — split `{r['split']}`, data `{r['data_manifest_sha256'][:12]}`, "
                     f"prompts `{r['prompt_version']}`, responder `{r['responder_model']}`")  # fmt: skip
    if len({r["data_manifest_sha256"] for r in reports}) > 1 or len({r["split"] for r in reports}) > 1:
        lines += ["", "**Warning: the runs were evaluated on different data; differences are not paired.**"]
    if len({r["prompt_version"] for r in reports}) > 1:
        lines += ["", "**Warning: the runs used different prompt versions.**"]
    lines += ["", "## Overall", "", "| run | condition | " + " | ".join(t for _, t in CONDITION_COLUMNS) + " |",
              "|---" * (len(CONDITION_COLUMNS) + 2) + "|"]  # fmt: skip
    for name, r in zip(names, reports, strict=True):
        for cond in r["conditions"]:
            m = r["metrics"]["overall"]["conditions"][cond]
            lines.append(f"| {name} | {cond} | " + " | ".join(_fmt(m.get(k)) for k, _ in CONDITION_COLUMNS) + " |")
    tasks = sorted({t for r in reports for t in r["metrics"]["by_task"]})
    lines += ["", "## Checkpoint by task: accuracy, gain over no state [95% CI]", "",
              "| task | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]  # fmt: skip
    for task in tasks:
        cells = []
        for r in reports:
            group = r["metrics"]["by_task"].get(task)
            if group is None:
                cells.append("–")
                continue
            acc = group["conditions"]["checkpoint"]["accuracy"]
            cells.append(f"{_fmt(acc)}, {_ci(group['differences']['checkpoint-no_state']['score'])}")
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def compare_png(reports: list[dict], path: Path) -> None:
    """Grouped bars: overall accuracy of every condition, one group per condition, one bar per run, with CIs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conditions = [c for c in reports[0]["conditions"] if all(c in r["conditions"] for r in reports)]
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(conditions) * max(1, len(reports) / 2)), 4.5))
    width = 0.8 / len(reports)
    for k, r in enumerate(reports):
        means, errs = [], [[], []]
        for cond in conditions:
            m = r["metrics"]["overall"]["conditions"][cond]
            mean = m["accuracy"] if m["accuracy"] is not None else 0.0
            low, high = m["accuracy_ci95"] or (mean, mean)
            means.append(mean)
            errs[0].append(mean - low)
            errs[1].append(high - mean)
        ax.bar([i + k * width for i in range(len(conditions))], means, width, yerr=errs, capsize=3, label=run_name(r))
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(conditions))], conditions)
    ax.set_ylabel("accuracy (95% CI)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title("memstate eval compare")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def compare_runs(runs: list[str], out_dir: str | Path) -> Path:
    """Write ``compare.md`` and ``compare.png`` into ``out_dir``; return it."""
    if len(runs) < 2:
        raise ConfigError("compare needs at least two runs")
    reports = [load_report(r) for r in runs]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(compare_markdown(reports))
    compare_png(reports, out / "compare.png")
    return out


def make_parser(prog: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Compare evaluation runs: a Markdown table and a bar chart.")
    p.add_argument("runs", nargs="+", help="Report dirs (or report.json files) of memstate eval runs.")
    p.add_argument("--out", required=True, help="Output dir for compare.md and compare.png.")
    return p


def run(args: argparse.Namespace) -> None:
    out = compare_runs(args.runs, args.out)
    print((out / "compare.md").read_text())
    print(f"chart: {out / 'compare.png'}")
