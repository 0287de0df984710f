"""FEVER → Instance dataset, built from the hand-written fixtures in tests/fixtures/fever."""

from __future__ import annotations

import json
import shutil
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

from data_build import fever
from data_build.build import DataConfig, build_data, load_data_config, resolve_path
from data_build.conflict import PERSPECTIVE_KINDS, TEMPLATES
from data_build.labels import LABELS
from data_build.splits import assign_splits, split_sizes
from memstate.data import SPLITS, load_split
from memstate.schema import Instance

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "fever"
CONFIG = ROOT / "configs" / "data" / "fever_fixture.yaml"

# What the fixtures hold (see tests/fixtures/fever/README.md):
# train.jsonl: 57 lines = 47 usable claims (27 SUPPORTS, 20 REFUTES) + 5 NEI + 3 malformed + 2 unresolvable;
# shared_task_dev.jsonl: 13 lines = 12 usable claims (7 SUPPORTS, 5 REFUTES) + 1 NEI.
TRAIN_LINES, DEV_LINES = 57, 13
USED, SUPPORTS, REFUTES = 59, 27 + 7, 20 + 5
BAD = {  # (file, line) → text the reason must contain
    ("train.jsonl", 13): "invalid JSON",
    ("train.jsonl", 23): "'claim'",
    ("train.jsonl", 37): "field 'label' is 'MOSTLY TRUE'",
    ("train.jsonl", 29): "page 'Mount_Everest' is not in the wiki dump",
    ("train.jsonl", 43): "page 'Mercury_-LRB-planet-RRB-' has no sentence 7",
}
NEI = {("train.jsonl", n) for n in (6, 18, 33, 46, 56)} | {("shared_task_dev.jsonl", 7)}
ESCAPES = ("-LRB-", "-RRB-", "-LSB-", "-RSB-", "-LCB-", "-RCB-", "-COLON-", "``", "''")


def fixture_config(**changes) -> DataConfig:
    return replace(load_data_config(CONFIG), fever_dir=str(FIXTURE), progress=False, **changes)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("fever_build")
    manifest = build_data(fixture_config(), out)
    splits = {s: load_split(out, s) for s in SPLITS}
    return out, manifest, splits


def all_instances(splits: dict[str, list[Instance]]) -> list[Instance]:
    return [i for s in SPLITS for i in splits[s]]


def by_claim(splits, claim_id: int) -> list[Instance]:
    return [i for i in all_instances(splits) if i.meta["claim_id"] == claim_id]


def test_counts_add_up(built):
    _, m, splits = built
    assert m["records_in"] == TRAIN_LINES + DEV_LINES == m["records_used"] + m["records_skipped"]
    assert m["records_used"] == USED
    assert m["records_skipped"] == len(BAD) + len(NEI)
    assert sorted(m["records_in_per_file"].values()) == sorted([TRAIN_LINES, DEV_LINES])
    assert m["instances_out"] == USED * 3 == sum(len(v) for v in splits.values())
    assert m["counts"]["perspective"] == {"belief": USED, "identity": USED, "expertise": USED}
    assert m["counts"]["answer"] == {"supported": SUPPORTS * 3, "refuted": REFUTES * 3}
    assert m["counts"]["split"] == {s: len(splits[s]) for s in SPLITS}
    assert m["counts"]["source"] == {"fever": USED * 3} and m["counts"]["task"] == {"evidence_conflict": USED * 3}
    assert m["skipped_by_kind"] == {"invalid_record": 3, "unresolved_evidence": 2, "not_enough_info": 6}
    kinds = {i["kind"] for i in m["inputs"]}
    assert kinds == {"fever_claims", "fever_wiki_pages"} and len(m["inputs"]) == 4
    assert all(len(i["sha256"]) == 64 and i["size"] == Path(i["path"]).stat().st_size for i in m["inputs"])
    assert json.loads((built[0] / "manifest.json").read_text()) == m


def test_bad_records_are_listed_with_file_and_line(built):
    skipped = {(Path(s["file"]).name, s["line"]): s for s in built[1]["skipped"]}
    for key, text in BAD.items():
        assert key in skipped, f"{key} not listed as skipped"
        assert text in skipped[key]["reason"], skipped[key]
        assert Path(skipped[key]["file"]) == FIXTURE / key[0]


def test_nei_claims_are_listed_as_skipped(built):
    nei = {(Path(s["file"]).name, s["line"]) for s in built[1]["skipped"] if s["kind"] == "not_enough_info"}
    assert nei == NEI
    assert all(s["reason"] == fever.NEI_REASON for s in built[1]["skipped"] if s["kind"] == "not_enough_info")


def test_no_group_in_two_splits(built):
    _, m, splits = built
    where = defaultdict(set)
    for split, instances in splits.items():
        for inst in instances:
            where[inst.meta["group"]].add(split)
    assert len(where) == USED
    assert all(len(s) == 1 for s in where.values())
    assert all(splits[s] for s in SPLITS)
    assert m["counts"]["groups_per_split"] == {"train": 47, "validation": 6, "test": 6}


def test_parquet_round_trip_matches_jsonl(built):
    out, _, splits = built
    for split in SPLITS:
        rows = [json.loads(line) for line in (out / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()]
        assert [Instance.from_dict(r) for r in rows] == splits[split]
        assert [i.to_dict() for i in splits[split]] == rows
    ids = [i.id for i in all_instances(splits)]
    assert len(set(ids)) == len(ids)


def test_instances_follow_the_contract(built):
    for inst in all_instances(built[2]):
        assert inst.labels == LABELS and inst.answer_kind == "label" and inst.options == ()
        assert inst.answer in ("supported", "refuted")
        assert inst.question == f"Is the following claim supported or refuted by the evidence? Claim: {claim_of(inst)}"
        assert [f.id for f in inst.facts] == [f"F{n}" for n in range(1, len(inst.facts) + 1)]
        assert all(f.scope == "global" for f in inst.facts)
        meta = inst.meta
        assert meta["group"] == f"fever:{meta['claim_id']}" and meta["source_file"] in (
            "train.jsonl",
            "shared_task_dev.jsonl",
        )
        assert all(v is not None for v in meta.values())


def claim_of(inst: Instance) -> str:
    return inst.question.split("Claim: ", 1)[1]


def test_user_memory_conflicts_with_every_evidence_fact(built):
    positions = Counter()
    for inst in all_instances(built[2]):
        user = [f for f in inst.facts if f.role == "conflict"]
        gold = [f for f in inst.facts if f.role == "gold"]
        assert len(user) == 1 and len(gold) == len(inst.facts) - 1 >= 1
        user = user[0]
        assert user.kind == PERSPECTIVE_KINDS[inst.perspective]
        assert all(f.kind == "evidence" for f in gold)
        assert {(r.src, r.type, r.dst) for r in inst.relations} == {(user.id, "CONFLICTS_WITH", g.id) for g in gold}
        assert len(inst.relations) == len(gold)
        # The memory asserts the opposite label: the claim is false when the evidence supports it, and vice versa.
        assert inst.meta["user_label"] != inst.answer
        quoted = claim_of(inst).rstrip(".").replace('"', "'")
        claim_is_true = inst.answer == "refuted"
        assert user.text in {t.render(quoted, claim_is_true) for t in TEMPLATES[inst.perspective]}
        assert user.text not in {t.render(quoted, not claim_is_true) for t in TEMPLATES[inst.perspective]}
        positions[(len(inst.facts), user.id)] += 1
    # Position must not reveal the role: with one evidence sentence the memory is sometimes F1, sometimes F2.
    assert positions[(2, "F1")] > 10 and positions[(2, "F2")] > 10


def test_escapes_are_decoded(built):
    splits = built[2]
    texts = [f.text for i in all_instances(splits) for f in i.facts if f.role == "gold"]
    assert not [t for t in texts if any(e in t for e in ESCAPES)]
    gold = {i.meta["claim_id"]: [f.text for f in i.facts if f.role == "gold"] for i in all_instances(splits)}
    assert gold[91011] == [
        "Mercury (planet): Mercury is the smallest planet in the Solar System and the closest to the Sun."
    ]
    assert gold[91013] == [
        "Halo: Combat Evolved: Halo: Combat Evolved is a 2001 military science fiction "
        "first-person shooter video game developed by Bungie and published by Microsoft Game "
        "Studios."
    ]
    assert gold[92011] == [
        "Python (programming language): Blocks are delimited by indentation rather than by curly brackets ({})."
    ]
    assert gold[92002] == [
        "Mount Kilimanjaro: Its summit, Uhuru Peak on Kibo, rises to about 5,895 metres (19,341 ft) above sea level."
    ]
    assert gold[91028] == ["Reykjavík: Reykjavík is the capital and largest city of Iceland."]
    assert gold[91049] == [
        '"Weird Al" Yankovic: He is known for humorous songs that parody popular music, often played on the accordion.'
    ]
    assert fever.decode_title("Savages_-LRB-2012_film-RRB-") == "Savages (2012 film)"
    assert fever.decode_sentence("Tokyo -LSB- x -RSB- is -LCB- y -RCB- ") == "Tokyo [x] is {y}"


def test_first_resolving_evidence_set_is_used(built):
    splits = built[2]
    meta = {i.meta["claim_id"]: i.meta for i in all_instances(splits)}
    # 91011: set 0 cites an empty row; 91050: set 0 cites a page absent from the dump.
    assert meta[91011]["evidence_set"] == 1
    assert meta[91050]["evidence_set"] == 1 and meta[91050]["evidence_pages"] == ["Neil_Armstrong"]
    # Two-sentence sets from different pages become two evidence facts.
    assert meta[91043]["evidence_set"] == 0
    assert meta[91043]["evidence_pages"] == ["Mona_Lisa", "Louvre"] and meta[91043]["evidence_sentences"] == [1, 0]
    for inst in by_claim(splits, 91015):
        assert sorted(f.text.split(":")[0] for f in inst.facts if f.role == "gold") == ["Alien (film)", "Ridley Scott"]


def test_build_is_deterministic(built, tmp_path):
    out, manifest, _ = built
    again = build_data(fixture_config(), tmp_path)
    assert again == manifest
    for split in SPLITS:
        for ext in ("parquet", "jsonl"):
            assert (tmp_path / f"{split}.{ext}").read_bytes() == (out / f"{split}.{ext}").read_bytes(), (split, ext)


def test_only_cited_pages_are_kept(built):
    wiki = built[1]["wiki"]
    assert wiki["pages_scanned"] == 34 and wiki["pages_cited"] == 31 and wiki["pages_kept"] == 29
    assert wiki["pages_missing"] == ["Mount_Everest", "Neil_Armstrong_-LRB-astronaut-RRB-"]
    # Ids escaped in the dump ("Reykjav\u00edk", "\"Weird_Al\"…") must still be found.
    wanted = {"Tokyo", "Reykjavík", '"Weird_Al"_Yankovic', "Not_A_Page"}
    scan = fever.scan_wiki(FIXTURE / "wiki-pages", wanted, progress=False)
    assert set(scan.pages) == wanted - {"Not_A_Page"}
    assert scan.pages_scanned == 34 and not scan.problems
    assert scan.pages["Tokyo"][1] == "The city was formerly known as Edo ."


def test_max_claims_stops_reading(tmp_path):
    m = build_data(fixture_config(max_claims=6), tmp_path)
    # Lines 1-5 and 7 are usable claims, line 6 is NEI: reading stops before line 8.
    assert (m["records_in"], m["records_used"], m["records_skipped"]) == (7, 6, 1)
    assert m["stopped_at"]["next_line"] == 8 and Path(m["stopped_at"]["file"]).name == "train.jsonl"
    assert m["wiki"]["pages_kept"] == 2  # Mount_Kilimanjaro and Marie_Curie only


def test_duplicate_claim_ids_are_skipped(tmp_path):
    src = tmp_path / "fever"
    shutil.copytree(FIXTURE / "wiki-pages", src / "wiki-pages")
    lines = (FIXTURE / "train.jsonl").read_text(encoding="utf-8").splitlines()
    (src / "claims.jsonl").write_text("\n".join([lines[0], lines[1], lines[0]]) + "\n", encoding="utf-8")
    m = build_data(replace(fixture_config(), fever_dir=str(src), fever_claim_files=["claims.jsonl"]), tmp_path / "o")
    assert (m["records_in"], m["records_used"], m["records_skipped"]) == (3, 2, 1)
    assert m["skipped"][0]["line"] == 3 and "duplicate claim id 91001" in m["skipped"][0]["reason"]


def test_load_split_names_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="validation.parquet"):
        load_split(tmp_path, "validation")


def test_config_yaml(tmp_path):
    cfg = load_data_config(CONFIG)
    assert cfg.fever_dir == "tests/fixtures/fever" and cfg.fever_claim_files == ["train.jsonl", "shared_task_dev.jsonl"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("fever_dir: x\nfever_claim_file: [a]\nsplits: {}\n")
    with pytest.raises(ValueError, match=r"\['fever_claim_file', 'splits'\]"):
        load_data_config(bad)
    bad.write_text("fever_dir: x\nsplit_ratios: {train: 0.5, validation: 0.1, test: 0.1}\n")
    with pytest.raises(ValueError, match="sum to 1"):
        load_data_config(bad)


def test_relative_fever_dir_resolves_from_the_project_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the config's relative path is not under the working directory here
    assert resolve_path(load_data_config(CONFIG).fever_dir).resolve() == FIXTURE


def test_assign_splits_by_group():
    keys = [f"fever:{n}" for n in range(100)]
    a = assign_splits(keys + keys[:10], seed=3)
    assert a == assign_splits(list(reversed(keys)), seed=3)
    assert Counter(a.values()) == {"train": 80, "validation": 10, "test": 10}
    assert a != assign_splits(keys, seed=4)
    assert Counter(assign_splits(["a", "b", "c"]).values()) == {"train": 1, "validation": 1, "test": 1}
    assert split_sizes(7, {"train": 0.8, "validation": 0.1, "test": 0.1}) == {"train": 5, "validation": 1, "test": 1}
    assert split_sizes(2, {"train": 0.8, "validation": 0.1, "test": 0.1}) == {"train": 2, "validation": 0, "test": 0}
