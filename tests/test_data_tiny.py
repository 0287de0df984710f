"""`memstate build-data --config configs/data/tiny.yaml`: all three sources from the fixtures."""

import hashlib
import json
from collections import defaultdict
from pathlib import Path

import pytest

from memstate.cli import main
from memstate.data import SPLITS, load_split
from memstate.data_build.build import build_data, load_data_config
from memstate.sources.skips import DataError

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "data" / "tiny.yaml"
OUTPUTS = [f"{s}.parquet" for s in SPLITS] + ["manifest.json", "README.md"]


def sha256s(out: Path) -> dict[str, str]:
    return {name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in OUTPUTS}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    assert main(["build-data", "--config", str(TINY), "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    return out, manifest, {s: load_split(out, s) for s in SPLITS}


def test_same_command_twice_gives_identical_files(tiny, tmp_path):
    out, _, _ = tiny
    assert main(["build-data", "--config", str(TINY), "--out", str(tmp_path)]) == 0
    assert sha256s(tmp_path) == sha256s(out)


def test_all_sources_perspectives_and_controls_are_present(tiny):
    counts = tiny[1]["counts"]
    assert set(counts["source"]) == {"fever", "scifact", "personamem"}
    for source in ("fever", "scifact"):
        for p in ("belief", "identity", "expertise"):
            for task in ("evidence_conflict", "evidence_consistent"):
                assert counts["source/task/perspective"].get(f"{source}/{task}/{p}", 0) > 0, (source, task, p)
    assert {k.split("/")[1] for k in counts["source/task/perspective"] if k.startswith("personamem/")} >= {
        "preference_current",
        "preference_history",
        "preference_update",
    }
    assert all(counts["split"][s] > 0 for s in SPLITS)


def test_no_group_in_two_splits(tiny):
    where = defaultdict(set)
    for split, instances in tiny[2].items():
        for inst in instances:
            where[inst.meta["group"]].add(split)
    assert len(where) > 50 and all(len(v) == 1 for v in where.values())


def has_cycle(edges: list[tuple[str, str]]) -> bool:
    """Kahn's algorithm: a directed graph has a cycle iff a topological sort cannot consume every node."""
    nodes = {n for e in edges for n in e}
    indegree = {n: 0 for n in nodes}
    for _, dst in edges:
        indegree[dst] += 1
    ready = [n for n in nodes if indegree[n] == 0]
    seen = 0
    while ready:
        node = ready.pop()
        seen += 1
        for src, dst in edges:
            if src == node:
                indegree[dst] -= 1
                if indegree[dst] == 0:
                    ready.append(dst)
    return seen != len(nodes)


def test_has_cycle_detects_cycles():
    assert has_cycle([("F3", "F2"), ("F2", "F1"), ("F1", "F3")])
    assert not has_cycle([("F3", "F2"), ("F2", "F1"), ("F3", "F1")])


def test_relations_reference_facts_and_supersedes_is_acyclic(tiny):
    n_supersedes = 0
    for inst in (i for split in tiny[2].values() for i in split):
        ids = {f.id for f in inst.facts}
        assert all(r.src in ids and r.dst in ids for r in inst.relations)
        supersedes = [(r.src, r.dst) for r in inst.relations if r.type == "SUPERSEDES"]
        assert not has_cycle(supersedes), inst.id
        n_supersedes += len(supersedes)
    assert n_supersedes > 0


def test_manifest_balances_per_file_and_lists_every_skip(tiny):
    m = tiny[1]
    per_file = m["records"]["per_file"]
    assert all(v["read"] == v["used"] + v["skipped"] for v in per_file.values())
    assert (
        m["records"]["read"]
        == m["records"]["used"] + m["records"]["skipped"]
        == sum(v["read"] for v in per_file.values())
    )
    assert len(m["skipped"]) == m["records"]["skipped"]
    skipped_dirs = {Path(s["file"]).parent.name for s in m["skipped"]}
    assert skipped_dirs == {"fever", "scifact", "personamem"}
    assert all(s["line"] >= 1 and s["reason"] for s in m["skipped"])
    sources = {Path(i["path"]).parts[2] for i in m["inputs"]}
    assert sources == {"fever", "scifact", "personamem"}


def test_strict_build_stops_at_first_structural_error(tmp_path):
    config = load_data_config(TINY, skip_invalid=False, progress=False)
    with pytest.raises(DataError, match=r"tests/fixtures/fever/train.jsonl:13: invalid JSON"):
        build_data(config, tmp_path)
    del config.sources["fever"]  # SciFact is read next: its first structural error is claims_train.jsonl line 4
    with pytest.raises(DataError, match=r"claims_train.jsonl:4: .*'claim'"):
        build_data(config, tmp_path)
    del config.sources["scifact"]
    with pytest.raises(DataError, match=r"questions_32k.csv:7: .*correct_answer"):
        build_data(config, tmp_path)


def test_caps_limit_source_task_and_perspective(tmp_path):
    caps = {"fever": 60, "fever/evidence_conflict/belief": 5, "scifact/evidence_consistent": 2}
    config = load_data_config(TINY, caps=caps, progress=False, shortcut_probe="warn")
    del config.sources["personamem"]
    m = build_data(config, tmp_path)
    # Capping SciFact's consistent controls leaves mostly conflicts: "contradict the user" becomes a shortcut again,
    # and the probe on the user memory's words says so.
    assert not m["shortcut_probes"]["passed"] and m["shortcut_probes"]["worst"]["source"] == "scifact"
    counts = m["counts"]["source/task/perspective"]
    assert m["counts"]["source"]["fever"] == 60
    assert counts["fever/evidence_conflict/belief"] == 5
    assert sum(v for k, v in counts.items() if k.startswith("scifact/evidence_consistent/")) == 2
    uncapped = build_data(load_data_config(TINY, progress=False, personamem=None), tmp_path / "all")
    dropped = uncapped["instances_out"] - m["instances_out"]
    assert dropped == sum(m["instances_capped"].values()) > 0
    assert set(m["instances_capped"]) <= set(caps)
