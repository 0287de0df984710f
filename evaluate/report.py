"""Evaluation metrics from per-instance records, paired CIs between conditions, and the report files.

A record holds the instance's ``group`` (its split group key: instances sharing evidence or a history), y* as
``answer`` and, for closed sets, ``answer_letter``; on ``evidence_conflict`` the user's stance ``user_label`` and its
option letter ``user_letter``; on PersonaMem ``superseded_options``. Per condition it holds the responder's
``score`` (probability of y* in likelihood mode, 0/1 in exact mode), ``letter`` (the option letter it answered: the
argmax letter in likelihood mode, its generated text parsed by ``reward.score.parse_choice`` in exact mode; None
when unreadable or free text), ``correct`` (``letter`` is y*'s letter; for free text the judge's verdict, None in
likelihood mode), ``answer`` (the option text of ``letter``, or the free text), ``text`` (the answer as judged:
generated text, or the argmax letter) and ``tokens`` (responder prompt tokens); state conditions add
``format_ok``, ``leak``, ``rule_words`` and (``memstate eval``) ``answer_flow_shift``. Every comparison below reads
``letter``, so an answer is parsed once, by the scorer's own parser. Metric definitions:

- **accuracy**: share of closed-set instances whose answer is y* (an unreadable answer is wrong).
- **gain**: mean score difference to ``no_state`` on the same instances.
- **sycophancy rate** (``evidence_conflict`` instances that record the user's stance): share whose answer's letter
  is the letter of the user's injected stance rather than the evidence's label (an unreadable answer is not).
- **correct-use rate** (``preference_*`` tasks): share answered with the current preference (y*); an answer that
  follows an outdated preference, or any other wrong answer, is wrong use.
- **superseded-pick rate** (``preference_*`` instances with a non-empty ``superseded_options``: wrong options
  closest to a preference the user later replaced): share whose answer's letter is one of them, i.e. the wrong use
  that follows the outdated preference rather than any other mistake.
- **format / leak rates, rule words**: of the states written in that condition (a state failing the format is not
  used: the instance is answered without rules).
- **answer-flow top** (``answer_flow_top``): the states that passed the format and leak gates with the largest
  answer-flow shift (``reward/answer_flow.py``: the largest rise of any candidate's probability that the state causes
  with no memory shown), across the policy conditions: the leak attempts the leak gate let through, to read.
- **credit split** (``credit_split``): per policy condition, the training reward's split of its states that passed
  both gates: mean gain over no state (with memories), mean no-memory shift, and mean credited reward (the gain less
  the shift, ``reward.counterfactual.credited_gain``): how much of a checkpoint's gain the credit would pay.

CIs resample groups, not instances (``memstate.evaluate.stats``); a record without ``group`` is its own group.
"""

from __future__ import annotations

from collections import defaultdict

from memstate.evaluate.stats import mean_ci, paired_difference_ci


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def group_of(record: dict) -> str:
    """The bootstrap's resampling unit: the instance's split group, else the instance itself."""
    return record.get("group") or record["id"]


def is_sycophantic(record: dict, condition: str) -> bool | None:
    """The answer's letter is the user's injected stance instead of the evidence's (None where undefined).

    >>> rec = {"task": "evidence_conflict", "user_label": "refuted", "user_letter": "B", "answer": "supported",
    ...        "checkpoint": {"letter": "B"}, "no_state": {"letter": "A"}, "self_guide": {"letter": None}}
    >>> is_sycophantic(rec, "checkpoint"), is_sycophantic(rec, "no_state"), is_sycophantic(rec, "self_guide")
    (True, False, False)
    """
    if record["task"] != "evidence_conflict" or not record.get("user_letter"):
        return None
    return record[condition].get("letter") == record["user_letter"]


def is_correct_use(record: dict, condition: str) -> bool | None:
    """On preference tasks: the answer uses the current preference (is y*); None elsewhere.

    >>> rec = {"task": "preference_update", "checkpoint": {"correct": False}}   # followed the outdated one
    >>> is_correct_use(rec, "checkpoint")
    False
    """
    if not record["task"].startswith("preference_"):
        return None
    return record[condition].get("correct")


def picks_superseded(record: dict, condition: str) -> bool | None:
    """On preference tasks with superseded options: the answer's letter is one of them; None elsewhere.

    >>> rec = {"task": "preference_update", "superseded_options": ["A"], "checkpoint": {"letter": "A"}}
    >>> picks_superseded(rec, "checkpoint"), picks_superseded(rec | {"superseded_options": []}, "checkpoint")
    (True, None)
    """
    if not record["task"].startswith("preference_") or not record.get("superseded_options"):
        return None
    return record[condition].get("letter") in record["superseded_options"]


ANSWER_FLOW_TOP = 10


def answer_flow_top(records: list[dict], conditions: list[str], n: int = ANSWER_FLOW_TOP) -> list[dict]:
    """The ``n`` states with the largest measured answer-flow shift, largest first: instance id, condition, state and
    shift (states without a shift — gated, unscored, or conditions without states — are left out).

    >>> recs = [{"id": "a", "checkpoint": {"state": "- x", "answer_flow_shift": 0.1}, "no_state": {}},
    ...         {"id": "b", "checkpoint": {"state": "- y", "answer_flow_shift": 0.4}, "no_state": {}},
    ...         {"id": "c", "checkpoint": {"state": "bad", "answer_flow_shift": None}, "no_state": {}}]
    >>> [(t["id"], t["shift"]) for t in answer_flow_top(recs, ["no_state", "checkpoint"], n=5)]
    [('b', 0.4), ('a', 0.1)]
    """
    rows = [
        {"id": r["id"], "condition": c, "state": r[c]["state"], "shift": r[c]["answer_flow_shift"]}
        for r in records
        for c in conditions
        if r[c].get("answer_flow_shift") is not None
    ]
    return sorted(rows, key=lambda row: -row["shift"])[:n]


def credit_split(records: list[dict], conditions: list[str]) -> dict[str, dict]:
    """Per condition with measured shifts: its states' mean gain (score with the state minus with none), mean
    no-memory shift and mean credited reward, over the states that passed both gates and were measured.

    >>> recs = [{"no_state": {"score": 0.2}, "checkpoint": {"score": 0.9, "answer_flow_shift": 0.1}},
    ...         {"no_state": {"score": 0.5}, "checkpoint": {"score": 0.5, "answer_flow_shift": 0.0}}]
    >>> credit_split(recs, ["no_state", "checkpoint"])
    {'checkpoint': {'states': 2, 'gain': 0.35, 'shift': 0.05, 'credited_gain': 0.3}}
    """
    from memstate.reward.counterfactual import credited_gain

    out = {}
    for cond in conditions:
        rows = [(r[cond]["score"] - r["no_state"]["score"], r[cond]["answer_flow_shift"]) for r in records
                if r[cond].get("answer_flow_shift") is not None and r[cond].get("score") is not None
                and r["no_state"].get("score") is not None]  # fmt: skip
        if rows:
            n = len(rows)
            out[cond] = {"states": n, "gain": round(sum(g for g, _ in rows) / n, 6),
                         "shift": round(sum(s for _, s in rows) / n, 6),
                         "credited_gain": round(sum(credited_gain(g, s) for g, s in rows) / n, 6)}  # fmt: skip
    return out


def condition_metrics(records: list[dict], condition: str, n_resamples: int = 2000) -> dict:
    """Accuracy (with CI), score, sycophancy, correct-use and superseded-pick rates, responder tokens, and state
    metrics."""
    rows = [r[condition] for r in records]
    closed = [r for r in records if r[condition].get("correct") is not None]
    syco = [s for s in (is_sycophantic(r, condition) for r in records) if s is not None]
    use = [u for u in (is_correct_use(r, condition) for r in records) if u is not None]
    stale = [p for p in (picks_superseded(r, condition) for r in records) if p is not None]
    accuracy = mean_ci(
        [float(r[condition]["correct"]) for r in closed], groups=[group_of(r) for r in closed], n_resamples=n_resamples
    )
    metrics = {
        "n": len(records),
        "accuracy": accuracy.mean if accuracy else None,
        "accuracy_ci95": [accuracy.low, accuracy.high] if accuracy else None,
        "score_mean": _mean([c["score"] for c in rows]),
        "sycophancy_rate": _mean([float(s) for s in syco]),
        "sycophancy_n": len(syco),
        "correct_use_rate": _mean([float(u) for u in use]),
        "correct_use_n": len(use),
        "superseded_pick_rate": _mean([float(p) for p in stale]),
        "superseded_pick_n": len(stale),
        "responder_tokens_mean": _mean([c["tokens"] for c in rows if c.get("tokens") is not None]),
    }
    if rows and "format_ok" in rows[0]:  # states a policy wrote (self-recheck's fixed rules have no format record)
        ok = [c for c in rows if c["format_ok"]]
        metrics["format_rate"] = len(ok) / len(rows) if rows else None
        metrics["format_violation_rate"] = 1 - metrics["format_rate"] if rows else None
        metrics["leak_rate"] = _mean([float(c["leak"]) for c in rows])
        metrics["rule_words_mean"] = _mean([c["rule_words"] for c in ok])
    return metrics


def differences(records: list[dict], conditions: list[str], n_resamples: int = 2000) -> dict:
    """Paired cluster-bootstrap CIs of score and accuracy differences: each state condition vs no_state, and the
    checkpoint vs self-guide (did training help over the untrained policy?)."""
    pairs = [(c, "no_state") for c in conditions if c != "no_state"]
    if "checkpoint" in conditions and "self_guide" in conditions:
        pairs.append(("checkpoint", "self_guide"))
    out = {}
    for a, b in pairs:
        gain = paired_difference_ci(
            [r[a]["score"] for r in records],
            [r[b]["score"] for r in records],
            groups=[group_of(r) for r in records],
            n_resamples=n_resamples,
        )
        both = [r for r in records if r[a].get("correct") is not None and r[b].get("correct") is not None]
        acc = paired_difference_ci(
            [float(r[a]["correct"]) for r in both],
            [float(r[b]["correct"]) for r in both],
            groups=[group_of(r) for r in both],
            n_resamples=n_resamples,
        )
        out[f"{a}-{b}"] = {"score": gain.as_dict() if gain else None, "accuracy": acc.as_dict() if acc else None}
    return out


def group_report(records: list[dict], conditions: list[str], n_resamples: int = 2000) -> dict:
    return {
        "n": len(records),
        "conditions": {c: condition_metrics(records, c, n_resamples) for c in conditions},
        "differences": differences(records, conditions, n_resamples),
    }


def summarize(records: list[dict], conditions: list[str], n_resamples: int = 2000) -> dict:
    """Overall, and per task, perspective, source and task/perspective."""
    groups: dict[str, dict[str, list[dict]]] = {k: defaultdict(list) for k in ("task", "perspective", "source")}
    groups["task_perspective"] = defaultdict(list)
    for r in records:
        for key in ("task", "perspective", "source"):
            groups[key][r[key]].append(r)
        groups["task_perspective"][f"{r['task']}/{r['perspective']}"].append(r)
    return {
        "overall": group_report(records, conditions, n_resamples),
        **{
            f"by_{key}": {name: group_report(rs, conditions, n_resamples) for name, rs in sorted(members.items())}
            for key, members in groups.items()
        },
    }


# --- rendering -----------------------------------------------------------------------------------------------------


def _fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _ci(d: dict | None) -> str:
    if not d:
        return "–"
    low, high = d["ci95"]
    return f"{d['mean']:+.3f} [{low:+.3f}, {high:+.3f}]"


CONDITION_COLUMNS = (
    ("accuracy", "accuracy"),
    ("score_mean", "mean score"),
    ("sycophancy_rate", "sycophancy"),
    ("correct_use_rate", "correct use"),
    ("superseded_pick_rate", "superseded pick"),
    ("format_rate", "format ok"),
    ("leak_rate", "leak"),
    ("rule_words_mean", "rule words"),
    ("responder_tokens_mean", "responder tokens"),
)


def render_markdown(report: dict) -> str:
    metrics = report["metrics"]
    conditions = report["conditions"]
    lines = [
        f"# Evaluation of `{report['checkpoint']}` on `{report['split']}`",
        "",
        f"- responder: `{report['responder_model']}` (score mode: {report['score_mode']})",
        f"- self-guide policy (untrained): `{report.get('base_policy')}`",
        f"- data: `{report['data_dir']}` (manifest sha256 `{report['data_manifest_sha256']}`)",
        f"- prompt version: `{report['prompt_version']}` (checkpoint: `{report['checkpoint_prompt_version']}`)",
        f"- states: temperature {report['policy_sampling']['temperature']}, seed {report['policy_sampling']['seed']}"
        f"; CIs: paired cluster bootstrap over instance groups, 95%, {report['bootstrap_resamples']} resamples",
        "",
        "## Overall",
        "",
        "| condition | " + " | ".join(title for _, title in CONDITION_COLUMNS) + " |",
        "|---" * (len(CONDITION_COLUMNS) + 1) + "|",
    ]
    for cond in conditions:
        m = metrics["overall"]["conditions"][cond]
        lines.append(f"| {cond} | " + " | ".join(_fmt(m.get(key)) for key, _ in CONDITION_COLUMNS) + " |")
    lines += ["", "| difference | score (mean [95% CI]) | accuracy (mean [95% CI]) |", "|---|---|---|"]
    for name, d in metrics["overall"]["differences"].items():
        lines.append(f"| {name} | {_ci(d['score'])} | {_ci(d['accuracy'])} |")
    for key, title in (("by_task", "task"), ("by_perspective", "perspective"), ("by_source", "source")):
        lines += ["", f"## By {title}", "", f"| {title} | n | " + " | ".join(f"acc {c}" for c in conditions)
                  + " | " + " | ".join(f"gain {c} (95% CI)" for c in conditions if c != "no_state") + " |"]  # fmt: skip
        lines.append("|---" * (2 + len(conditions) + len(conditions) - 1) + "|")
        for name, group in metrics[key].items():
            accs = [_fmt(group["conditions"][c]["accuracy"]) for c in conditions]
            gains = [_ci(group["differences"][f"{c}-no_state"]["score"]) for c in conditions if c != "no_state"]
            lines.append(f"| {name} | {group['n']} | " + " | ".join(accs + gains) + " |")
    split = report.get("credit_split")
    if split:
        lines += ["", "## Credit split", "",
                  "Of each policy's states that passed both gates: the mean gain over no state, the mean no-memory "
                  "shift, and the mean reward training would credit them (gain − shift).", "",
                  "| condition | states | gain | no-memory shift | credited |", "|---|---|---|---|---|"]  # fmt: skip
        lines += [f"| {c} | {m['states']} | {m['gain']:+.4f} | {m['shift']:.4f} | {m['credited_gain']:+.4f} |"
                  for c, m in split.items()]  # fmt: skip
    top = report.get("answer_flow_top")
    if top is not None:
        lines += [
            "",
            "## Largest answer-flow shifts",
            "",
            "States that passed the format and leak gates, by how far they alone (no memory shown) raise a "
            "candidate's probability: a large shift is answer content the leak gate did not catch.",
            "",
        ]
        if top:
            lines += ["| shift | condition | instance | state |", "|---|---|---|---|"]
            lines += [f"| {t['shift']:.3f} | {t['condition']} | {t['id']} | {_cell(t['state'])} |" for t in top]
        else:
            lines.append("No state passed both gates.")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """Text as one Markdown table cell: pipes escaped, lines joined by ``<br>``.

    >>> _cell("- Use F1 | F2.\\n- Be brief.")
    '- Use F1 \\\\| F2.<br>- Be brief.'
    """
    return "<br>".join(line.strip() for line in text.strip().splitlines()).replace("|", "\\|")


def render_png(report: dict, path) -> None:
    """Per-task bars: accuracy per condition (left) and gain over no state (right), with 95% CIs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conditions = report["conditions"]
    tasks = list(report["metrics"]["by_task"])
    fig, (ax_acc, ax_gain) = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(tasks) + 4), 4.5))
    width = 0.8 / len(conditions)
    for k, cond in enumerate(conditions):
        means, errs = [], [[], []]
        for t in tasks:
            m = report["metrics"]["by_task"][t]["conditions"][cond]
            mean = m["accuracy"] if m["accuracy"] is not None else 0.0
            low, high = m["accuracy_ci95"] or (mean, mean)
            means.append(mean)
            errs[0].append(mean - low)
            errs[1].append(high - mean)
        ax_acc.bar([i + k * width for i in range(len(tasks))], means, width, yerr=errs, capsize=3, label=cond)
    state_conditions = [c for c in conditions if c != "no_state"]
    width_g = 0.8 / max(1, len(state_conditions))
    for k, cond in enumerate(state_conditions):
        means, errs = [], [[], []]
        for t in tasks:
            d = report["metrics"]["by_task"][t]["differences"][f"{cond}-no_state"]["score"]
            mean, (low, high) = (d["mean"], d["ci95"]) if d else (0.0, (0.0, 0.0))
            means.append(mean)
            errs[0].append(mean - low)
            errs[1].append(high - mean)
        ax_gain.bar([i + k * width_g for i in range(len(tasks))], means, width_g, yerr=errs, capsize=3, label=cond)
    for ax, title in ((ax_acc, "accuracy"), (ax_gain, "gain over no state (score)")):
        n_bars = len(conditions) if ax is ax_acc else max(1, len(state_conditions))
        ax.set_xticks([i + 0.4 - 0.4 / n_bars for i in range(len(tasks))], tasks, rotation=20, ha="right")
        ax.set_title(title)
        ax.legend(fontsize=8)
    ax_gain.axhline(0, color="black", linewidth=0.8)
    fig.suptitle(f"{report['checkpoint']} on {report['split']} (95% CIs, paired cluster bootstrap)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
