"""Evaluation metrics from per-instance records, and the Markdown report."""

from __future__ import annotations

from collections import defaultdict


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def group_metrics(records: list[dict]) -> dict:
    """Accuracy and mean score per condition, gain, and format/leak rates over ``records``.

    >>> recs = [{"format_ok": True, "leak": False, "rule_words": 10,
    ...          "no_state": {"score": 0.2, "correct": False}, "checkpoint": {"score": 0.6, "correct": True}},
    ...         {"format_ok": False, "leak": False, "rule_words": 0,
    ...          "no_state": {"score": 0.5, "correct": True}, "checkpoint": {"score": 0.5, "correct": True}}]
    >>> m = group_metrics(recs)
    >>> m["accuracy_no_state"], m["accuracy_checkpoint"], round(m["gain_mean"], 3), m["format_rate"]
    (0.5, 1.0, 0.2, 0.5)
    """
    n = len(records)
    ok = [r for r in records if r["format_ok"]]
    metrics = {"n": n}
    for cond in ("no_state", "checkpoint"):
        closed = [r[cond]["correct"] for r in records if r[cond]["correct"] is not None]
        metrics[f"accuracy_{cond}"] = _mean([float(c) for c in closed])
        metrics[f"score_{cond}"] = _mean([r[cond]["score"] for r in records])
    metrics["gain_mean"] = _mean([r["checkpoint"]["score"] - r["no_state"]["score"] for r in records])
    metrics["format_rate"] = len(ok) / n if n else None
    metrics["leak_rate"] = sum(r["leak"] for r in records) / n if n else None
    metrics["rule_words_mean"] = _mean([r["rule_words"] for r in ok])
    return metrics


def summarize(records: list[dict]) -> dict:
    by_group: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_group[f"{r['task']}/{r['perspective']}"].append(r)
    return {
        "overall": group_metrics(records),
        "by_task_perspective": {k: group_metrics(v) for k, v in sorted(by_group.items())},
    }


def _fmt(value: float | int | None) -> str:
    if value is None:
        return "–"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


COLUMNS = (
    ("n", "n"),
    ("accuracy_no_state", "acc (no state)"),
    ("accuracy_checkpoint", "acc (checkpoint)"),
    ("gain_mean", "mean gain"),
    ("format_rate", "format ok"),
    ("leak_rate", "leak"),
    ("rule_words_mean", "rule words"),
)


def render_markdown(report: dict) -> str:
    rows = [("**overall**", report["metrics"]["overall"]), *report["metrics"]["by_task_perspective"].items()]
    lines = [
        f"# Evaluation of `{report['checkpoint']}` on `{report['split']}`",
        "",
        f"- responder: `{report['responder_model']}` (score mode: {report['score_mode']})",
        f"- data: `{report['data_dir']}` (manifest sha256 `{report['data_manifest_sha256']}`)",
        f"- prompt version: `{report['prompt_version']}` (checkpoint: `{report['checkpoint_prompt_version']}`)",
        "- gain = P(y* | memories, state) − P(y* | memories); accuracy = the responder's most likely option is y*",
        "",
        "| group | " + " | ".join(title for _, title in COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 1) + "|",
    ]
    for name, m in rows:
        lines.append(f"| {name} | " + " | ".join(_fmt(m[key]) for key, _ in COLUMNS) + " |")
    return "\n".join(lines) + "\n"
