"""``memstate eval sweep``: the reasoning-state policy on top of every memory system (cross-system transfer).

The policy is meant to sit on top of *any* memory system. For each memory backend (``naive``, ``evomem``, ``clag``,
``memsearch``; ``memstate.memory.retrieve``) the same MemSyco-Bench rows are run through ``evaluate_memsyco`` with
``memory_backend`` set — the row's dialogue is ingested into its own store, the backend retrieves the facts for the
question — and answered by the same frozen responder without a state (``no_state``) and with the checkpoint's
states (``checkpoint``), each answer labelled by the benchmark's LLM judge. Per backend the report is under
``OUT/<backend>/`` (``memsyco_report.json`` / ``.md``, the stores).

The gain of the policy on a backend is pass(checkpoint) − pass(no_state) over the rows judged in both conditions
(paired: the same row, the same retrieved facts), with a paired percentile-bootstrap 95% CI
(``memstate.evaluate.stats.paired_difference_ci``); pass rates in the table are over those same paired rows. Written:
``sweep.json`` (every figure, overall and per task, plus the settings), ``sweep.md`` (the table) and ``sweep.png``
(pass rates per backend and condition; the gain per backend with its CI).
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from memstate.errors import ConfigError
from memstate.evaluate.memsyco.run import (
    JudgeArgs,
    MemSycoEvalConfig,
    MemSycoParser,
    add_memsyco_arguments,
    evaluate_memsyco,
    remove_if_created,
)
from memstate.evaluate.stats import paired_difference_ci
from memstate.memory.backends import backend_names, get_backend
from memstate.memory.extract import DEFAULT_EXTRACTOR
from memstate.memory.relation_rule import RELATION_RULE_VERSION

logger = logging.getLogger("memstate.evaluate.sweep")


@dataclass
class SweepConfig:
    """One MemSyco-Bench evaluation (its ``checkpoint`` required), run once per backend under ``out_dir/BACKEND``."""

    evaluation: MemSycoEvalConfig = field(metadata={"help": "Everything but the backend (and its out_dir)."})
    backends: list[str] = field(default_factory=lambda: list(backend_names()))
    bootstrap_resamples: int = 2000

    def eval_config(self, backend: str) -> MemSycoEvalConfig:
        return replace(self.evaluation, out_dir=str(Path(self.evaluation.out_dir) / backend), memory_backend=backend)


def _rate(values: list[int]) -> float | None:
    return sum(values) / len(values) if values else None


def policy_gain(records: list[dict[str, Any]], n_resamples: int = 2000) -> dict[str, Any]:
    """Pass rates and the paired gain checkpoint − no_state over the rows judged in both conditions.

    >>> recs = [{"condition": c, "id": i, "passed": p, "state": {"format_ok": True}, "memory": {"store_ids": ["m1"]}}
    ...         for c, i, p in [("no_state", "a", False), ("checkpoint", "a", True), ("no_state", "b", True),
    ...                         ("checkpoint", "b", True), ("no_state", "c", None), ("checkpoint", "c", False)]]
    >>> g = policy_gain(recs)
    >>> g["rows"], g["paired"], g["pass_no_state"], g["pass_checkpoint"], g["gain"]["mean"]
    (3, 2, 0.5, 1.0, 0.5)
    """
    by = {(r["condition"], r["id"]): r for r in records}
    ids = list(dict.fromkeys(r["id"] for r in records if r["condition"] == "no_state"))
    paired = [
        i
        for i in ids
        if ("checkpoint", i) in by
        and by[("checkpoint", i)]["passed"] is not None
        and by[("no_state", i)]["passed"] is not None
    ]
    pairs = [(int(by[("checkpoint", i)]["passed"]), int(by[("no_state", i)]["passed"])) for i in paired]
    # The bootstrap resamples split groups; a MemSyco row is its own group (to_instance: meta["group"] = row id).
    groups = [by[("no_state", i)].get("group") or i for i in paired]
    ci = paired_difference_ci([a for a, _ in pairs], [b for _, b in pairs], groups=groups, n_resamples=n_resamples)
    states = [by[("checkpoint", i)].get("state") or {} for i in ids if ("checkpoint", i) in by]
    n_facts = [len((by[("no_state", i)].get("memory") or {}).get("store_ids", [])) for i in ids]
    return {
        "rows": len(ids),
        "paired": len(pairs),
        "pass_no_state": _rate([b for _, b in pairs]),
        "pass_checkpoint": _rate([a for a, _ in pairs]),
        "gain": ci.as_dict() if ci else None,
        "state_format_ok": _rate([int(bool(s.get("format_ok"))) for s in states]),
        "mean_facts": _rate(n_facts),
    }


def summarize_backend(report: dict[str, Any], n_resamples: int = 2000) -> dict[str, Any]:
    records = report["records"]
    tasks = sorted({r["task"] for r in records})
    memory = report["data"].get("memory") or {}
    return {
        "overall": policy_gain(records, n_resamples),
        "by_task": {t: policy_gain([r for r in records if r["task"] == t], n_resamples) for t in tasks},
        "decisions": memory.get("decisions"),
        "unjudged": len(report["unjudged"]),
    }


def _fmt(value: float | int | None) -> str:
    return "–" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def _gain(g: dict | None) -> str:
    if not g:
        return "–"
    low, high = g["ci95"]
    return f"{g['mean']:+.3f} [{low:+.3f}, {high:+.3f}]"


def render_markdown(sweep: dict[str, Any]) -> str:
    s = sweep["settings"]
    lines = [
        "# The reasoning-state policy across memory systems (MemSyco-Bench)",
        "",
        f"- policy checkpoint: `{s['checkpoint']}`; responder: `{s['responder_model']}`; judge: `{s['judge_model']}`",
        f"- data: {', '.join(s['files'])} (at most {s['max_rows'] or 'all'} rows per file); memory: "
        f"{s.get('memory_extractor', 'rule')} extractor (relations {s.get('relation_rule', 'unrecorded')}), "
        f"embedder `{s['memory_embedder']}`, k = {s['memory_k']}",
        "- decisions: " + "; ".join(f"{b}: {d}" for b, d in s["memory_decisions"].items()),
        "- pass rates over the rows judged in both conditions; gain = checkpoint − no_state with a paired bootstrap "
        f"95% CI ({s['bootstrap_resamples']} resamples)",
        "",
        "| backend | rows | paired | pass no_state | pass checkpoint | gain [95% CI] | states ok | facts/row |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for backend, b in sweep["backends"].items():
        o = b["overall"]
        lines.append(
            f"| {backend} | {o['rows']} | {o['paired']} | {_fmt(o['pass_no_state'])} | {_fmt(o['pass_checkpoint'])} "
            f"| {_gain(o['gain'])} | {_fmt(o['state_format_ok'])} | {_fmt(o['mean_facts'])} |"
        )
    lines += ["", "## By task", "", "| backend | task | paired | pass no_state | pass checkpoint | gain [95% CI] |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for backend, b in sweep["backends"].items():
        for task, g in b["by_task"].items():
            lines.append(f"| {backend} | {task} | {g['paired']} | {_fmt(g['pass_no_state'])} | "
                         f"{_fmt(g['pass_checkpoint'])} | {_gain(g['gain'])} |")  # fmt: skip
    lines += ["", "Per-backend reports: " + ", ".join(f"`{b}/memsyco_report.md`" for b in sweep["backends"]) + "."]
    return "\n".join(lines) + "\n"


def render_png(sweep: dict[str, Any], path: Path) -> None:
    """Left: pass rate per backend, no_state vs checkpoint. Right: the policy's gain per backend with its 95% CI."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = list(sweep["backends"])
    overall = [sweep["backends"][b]["overall"] for b in backends]
    x = range(len(backends))
    fig, (ax_pass, ax_gain) = plt.subplots(1, 2, figsize=(max(8, 2.0 * len(backends) + 4), 4.2))
    for k, (key, label) in enumerate((("pass_no_state", "no_state"), ("pass_checkpoint", "checkpoint"))):
        ax_pass.bar([i + (k - 0.5) * 0.38 for i in x], [o[key] or 0.0 for o in overall], 0.38, label=label)
    ax_pass.set_ylim(0, 1.12)
    ax_pass.set_title("pass rate (paired rows)")
    ax_pass.legend(fontsize=8, loc="upper right", ncols=2)
    means, low, high = [], [], []
    for o in overall:
        g = o["gain"] or {"mean": 0.0, "ci95": [0.0, 0.0]}
        means.append(g["mean"])
        low.append(g["mean"] - g["ci95"][0])
        high.append(g["ci95"][1] - g["mean"])
    colors = ["tab:green" if m > 0 else "tab:red" if m < 0 else "tab:gray" for m in means]
    ax_gain.bar(list(x), means, 0.6, yerr=[low, high], capsize=4, color=colors)
    for i, (m, o) in enumerate(zip(means, overall, strict=True)):
        ax_gain.annotate(f"{m:+.3f}\nn={o['paired']}", (i + 0.32, m), ha="left", va="center", fontsize=8,
                         xytext=(2, 0), textcoords="offset points")  # fmt: skip
    ax_gain.axhline(0, color="black", linewidth=0.8)
    ax_gain.set_title("gain of the policy (checkpoint − no_state, 95% CI)")
    for ax in (ax_pass, ax_gain):
        ax.set_xticks(list(x), backends)
    checkpoint = Path(sweep["settings"]["checkpoint"])
    fig.suptitle(f"reasoning-state policy {checkpoint.parent.name}/{checkpoint.name} across memory systems "
                 "(MemSyco-Bench)", fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_sweep(config: SweepConfig) -> Path:
    """Evaluate every backend with and without the policy's states; write sweep.json / .md / .png; return OUT."""
    if not config.backends:
        raise ConfigError("give at least one memory backend to sweep (--backends)")
    for name in config.backends:
        get_backend(name)  # every name is known before the first backend runs
    if not config.evaluation.checkpoint:
        raise ConfigError("a sweep measures the policy: give --checkpoint")
    ev = config.evaluation
    out = Path(ev.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    files: list[str] = []
    decisions: dict[str, str] = {}
    for backend in config.backends:
        logger.info("sweep: backend %s", backend)
        report_dir = evaluate_memsyco(config.eval_config(backend))
        report = json.loads((report_dir / "memsyco_report.json").read_text())
        results[backend] = summarize_backend(report, config.bootstrap_resamples)
        files = [f"{Path(f['path']).name} ({f['rows_used']} rows)" for f in report["data"]["files"]]
        decisions[backend] = results[backend]["decisions"]
    sweep = {
        "settings": {
            "checkpoint": ev.checkpoint,
            "responder_model": ev.responder_model,
            "judge_model": ev.judge.model,
            "judge_url": ev.judge.url,
            "files": files,
            "max_rows": ev.max_rows,
            "memory_k": ev.memory_k,
            "memory_extractor": DEFAULT_EXTRACTOR,  # as `memory ingest` (evaluate.memsyco.run.pipeline_instance)
            "relation_rule": RELATION_RULE_VERSION,
            "memory_embedder": ev.memory_embedder or "all-MiniLM-L6-v2",
            "memory_decisions": decisions,
            "clag_bootstrap_min": ev.clag_bootstrap_min,
            "memory_options": ev.memory_options,
            "policy_temperature": ev.policy_temperature,
            "seed": ev.seed,
            "bootstrap_resamples": config.bootstrap_resamples,
        },
        "backends": results,
    }
    (out / "sweep.json").write_text(json.dumps(sweep, indent=2))
    (out / "sweep.md").write_text(render_markdown(sweep))
    render_png(sweep, out / "sweep.png")
    logger.info("sweep report in %s", out)
    return out


# ---- memstate eval sweep --------------------------------------------------------------------------------------------


@dataclass
class SweepArgs:
    backends: list[str] = field(
        default_factory=lambda: list(backend_names()),
        metadata={"help": "Memory backends to sweep (default: every registered one; memstate.memory.backends)."},
    )
    bootstrap_resamples: int = field(default=2000, metadata={"help": "Paired bootstrap resamples."})


def make_parser(prog: str | None = None) -> MemSycoParser:
    parser = MemSycoParser(
        (MemSycoEvalConfig, JudgeArgs, SweepArgs),
        prog=prog,
        description="Runs `eval memsyco --memory_backend B` for each backend (--backends; a --memory_backend given "
        "here is replaced) with conditions no_state and checkpoint on the same rows; writes OUT/sweep.md (pass rates "
        "and the policy's gain with a paired bootstrap CI per backend), sweep.json, sweep.png, and each backend's "
        "report under OUT/<backend>/ (evaluate/sweep.py). --checkpoint is required.",
    )
    add_memsyco_arguments(parser)
    return parser


def run(parsed: tuple[MemSycoEvalConfig, JudgeArgs, SweepArgs, argparse.Namespace]) -> None:
    evaluation, _, sweep, _ = parsed
    if not evaluation.responder_model:
        raise ConfigError("responder_model is required (the responder that answers the rows)")
    with remove_if_created(evaluation.out_dir):
        out = run_sweep(SweepConfig(evaluation, sweep.backends, sweep.bootstrap_resamples))
    print((out / "sweep.md").read_text())
    print(f"chart: {out / 'sweep.png'}")
