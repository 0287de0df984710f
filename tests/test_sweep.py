"""``memstate eval sweep`` end to end: the tiny policy and responder over MemSyco-Bench rows on all four memory
backends (naive, evomem, clag, memsearch), no_state and checkpoint, judged by a scripted judge behind a real local
OpenAI-compatible server; sweep.md / sweep.json / sweep.png are written and the PNG is opened."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from chat_server import ChatServer
from PIL import Image
from shipped_data import MEMSYCO

from memstate.evaluate.stats import paired_difference_ci
from memstate.evaluate.sweep import policy_gain
from memstate.memory.backends import backend_names

ROOT = Path(__file__).resolve().parents[1]
DATA = MEMSYCO
FILES = [DATA / "memory_evidence_conflict.jsonl", DATA / "valid_memory_selection.jsonl"]


def judge(body):
    """Labels for both tasks in one object (the reader takes the task's own); pass or fail by the hash of the payload
    (row and answer), so rows differ, and the two conditions differ where the tiny responder's answers differ."""
    good = int(hashlib.sha256(body["messages"][1]["content"].encode()).hexdigest(), 16) % 2 == 0
    labels = {"accuracy": int(good), "misled_by_conflicting_memory": int(not good),
              "uses_latest_preference": int(good), "outdated_preference_contamination": int(not good)}  # fmt: skip
    return 200, json.dumps(labels)


def test_sweep_runs_every_backend_and_writes_table_and_png(tiny_models, tmp_path):
    from memstate.cli import main

    out = tmp_path / "sweep"
    with ChatServer(judge) as server:
        argv = ["eval", "sweep", *map(str, FILES), "--responder-model", str(tiny_models["responder"]),
                "--checkpoint", str(tiny_models["policy"]), "--judge-url", server.url, "--judge-model", "judge",
                "--max-rows", "1", "--memory-k", "3", "--memory-embedder", "hash-384", "--clag-bootstrap-min", "4",
                "--policy-max-new-tokens", "8", "--answer-max-tokens", "8", "--bootstrap-resamples", "200",
                "--out", str(out)]  # fmt: skip
        assert main(argv) == 0
    rows = len(FILES)
    assert len(server.requests) == rows * 2 * len(backend_names())  # every row × condition × backend judged once
    sweep = json.loads((out / "sweep.json").read_text())
    assert list(sweep["backends"]) == list(backend_names())
    assert sweep["settings"]["memory_decisions"]["clag"].startswith("rule-based (nearest-centroid routing")
    assert sweep["settings"]["memory_decisions"]["memsearch"].startswith("rule-based (extractive fragments")
    for backend, summary in sweep["backends"].items():
        report = json.loads((out / backend / "memsyco_report.json").read_text())
        assert report["data"]["memory"]["backend"] == backend and set(report["metrics"]) == {"no_state", "checkpoint"}
        records = report["records"]
        assert all(r["memory"]["backend"] == backend and r["memory"]["store_ids"] for r in records)
        o = summary["overall"]
        assert (o["rows"], o["paired"]) == (rows, rows) and summary["unjudged"] == 0
        by = {(r["condition"], r["id"]): int(r["passed"]) for r in records}
        ids = [r["id"] for r in records if r["condition"] == "no_state"]
        ci = paired_difference_ci([by[("checkpoint", i)] for i in ids], [by[("no_state", i)] for i in ids],
                                  n_resamples=200)  # fmt: skip
        assert o["gain"] == ci.as_dict() and o["pass_no_state"] == sum(by[("no_state", i)] for i in ids) / rows
        assert set(summary["by_task"]) == {"memory_evidence_conflict", "valid_memory_selection"}

    def traces(backend):
        report = json.loads((out / backend / "memsyco_report.json").read_text())
        return [r["memory"]["trace"] for r in report["records"]]

    assert all(t["router"] == "nearest-centroid" and t["mode"] for t in traces("clag"))
    assert all(t["extractor"] == "extractive" and t["seeds"] for t in traces("memsearch"))
    table = (out / "sweep.md").read_text()
    for backend in backend_names():
        assert f"| {backend} | {rows} | {rows} |" in table
    assert "gain [95% CI]" in table and "## By task" in table
    with Image.open(out / "sweep.png") as png:
        assert png.format == "PNG" and png.size[0] >= 800 and png.size[1] >= 400
        colours = png.convert("RGB").getcolors(maxcolors=1 << 16)
        assert colours is not None and len(colours) > 20  # bars, text and axes were drawn, not a blank canvas


def test_policy_gain_leaves_out_rows_unjudged_in_either_condition():
    records = [
        {"condition": c, "id": i, "passed": p}
        for c, i, p in [("no_state", "a", True), ("checkpoint", "a", False), ("no_state", "b", None),
                        ("checkpoint", "b", True), ("no_state", "c", False), ("checkpoint", "c", True)]
    ]  # fmt: skip
    g = policy_gain(records, n_resamples=100)
    assert (g["rows"], g["paired"], g["pass_no_state"], g["pass_checkpoint"]) == (3, 2, 0.5, 0.5)
    assert g["gain"]["mean"] == 0.0 and g["state_format_ok"] == 0.0


def test_a_toy_backend_registered_in_one_module_runs_memsyco_and_the_sweep(tiny_models, tmp_path):
    """Adding a backend touches its module only: the toy ``recency`` backend (tests/test_memory_backends.py) is
    registered, then named on the command line of ``eval memsyco`` and ``eval sweep`` like a built-in."""
    from test_memory_backends import RECENCY

    from memstate.cli import main
    from memstate.memory.backends import register, unregister

    common = ["--responder", str(tiny_models["responder"]), "--max-rows", "1", "--memory-k", "2",
              "--memory-embedder", "hash-384", "--answer-max-tokens", "4"]  # fmt: skip
    register(RECENCY)
    try:
        with ChatServer(judge) as server:
            judge_args = ["--judge-url", server.url, "--judge-model", "judge"]
            memsyco = tmp_path / "memsyco"
            argv = ["eval", "memsyco", str(FILES[0]), *common, *judge_args, "--memory-backend", "recency",
                    "--out", str(memsyco)]  # fmt: skip
            assert main(argv) == 0
            sweep = tmp_path / "sweep"
            argv = ["eval", "sweep", str(FILES[0]), *common, *judge_args, "--checkpoint", str(tiny_models["policy"]),
                    "--backends", "recency", "naive", "--policy-max-new-tokens", "4", "--bootstrap-resamples", "50",
                    "--out", str(sweep)]  # fmt: skip
            assert main(argv) == 0
    finally:
        unregister("recency")
    report = json.loads((memsyco / "memsyco_report.json").read_text())
    memory = report["data"]["memory"]
    assert memory["backend"] == "recency" and memory["decisions"] == "none (stored order)"
    assert memory["settings"] == {"newest_first": True}
    (record,) = report["records"]
    assert record["memory"]["trace"]["mode"] == "recency" and len(record["memory"]["store_ids"]) == 2
    summary = json.loads((sweep / "sweep.json").read_text())
    assert list(summary["backends"]) == ["recency", "naive"]
    assert summary["settings"]["memory_decisions"]["recency"] == "none (stored order)"
    assert "| recency | 1 | 1 |" in (sweep / "sweep.md").read_text()
    # Unregistered, the name is an error at once (exit 2, one line), before a store or report is made.
    assert main(["eval", "memsyco", str(FILES[0]), *common, "--judge-url", "http://127.0.0.1:9", "--judge-model",
                 "j", "--memory-backend", "recency", "--out", str(tmp_path / "gone")]) == 2  # fmt: skip
    assert not (tmp_path / "gone").exists()
