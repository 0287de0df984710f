"""FEVER → Instance dataset, built from the hand-written fixtures in tests/fixtures/fever."""

from __future__ import annotations

import json
import shutil
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
from datasets import load_from_disk

from memstate.data import SPLITS, load_split
from memstate.data_build.build import DataConfig, build_data, load_data_config
from memstate.data_build.conflict import PERSPECTIVE_KINDS, TEMPLATES, user_memory_text
from memstate.data_build.labels import LABELS, claim_question
from memstate.data_build.registry import resolve_path
from memstate.data_build.splits import assign_splits, split_sizes
from memstate.schema import Instance
from memstate.sources import fever as fever_source
from memstate.sources.skips import DataError, SkipLog

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
NEI = {("train.jsonl", n) for n in (6, 18, 33, 46, 56)} | {("shared_task_dev.jsonl", 7)}  # now used
ESCAPES = ("-LRB-", "-RRB-", "-LSB-", "-RSB-", "-LCB-", "-RCB-", "-COLON-", "``", "''")


def fixture_config(**changes) -> DataConfig:
    fever_changes = {k: changes.pop(k) for k in ("dir", "claim_files", "max_claims") if k in changes}
    config = load_data_config(CONFIG, progress=False)
    config.sources["fever"] = replace(config.sources["fever"], **({"dir": str(FIXTURE)} | fever_changes))
    return replace(config, **changes)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("fever_build")
    manifest = build_data(fixture_config(), out)
    splits = {s: load_split(out, s) for s in SPLITS}
    return out, manifest, splits


def all_instances(splits: dict[str, list[Instance]]) -> list[Instance]:
    return [i for s in SPLITS for i in splits[s]]


def by_claim(splits, claim_id: int) -> list[Instance]:
    return [i for i in all_instances(splits) if i.meta["claim_id"] == str(claim_id)]


def test_counts_add_up(built):
    _, m, splits = built
    rec = m["records"]
    claim_files = {k: v for k, v in rec["per_file"].items() if "wiki-pages" not in k}
    assert sorted(v["read"] for v in claim_files.values()) == sorted([TRAIN_LINES, DEV_LINES])
    assert sum(v["used"] for v in claim_files.values()) == USED + len(NEI)
    assert rec["skipped"] == len(BAD) and rec["read"] == rec["used"] + rec["skipped"]
    assert all(v["read"] == v["used"] + v["skipped"] for v in rec["per_file"].values())
    groups = USED + len(NEI)
    assert m["instances_out"] == groups * 3 == sum(len(v) for v in splits.values())
    assert m["counts"]["perspective"] == {"belief": groups, "expertise": groups, "identity": groups}
    assert m["counts"]["answer"] == {
        "fever/supported": SUPPORTS * 3, "fever/refuted": REFUTES * 3, "fever/not enough info": len(NEI) * 3
    }  # fmt: skip
    assert m["counts"]["split"] == {s: len(splits[s]) for s in SPLITS}
    assert m["counts"]["source"] == {"fever": groups * 3}
    assert set(m["counts"]["task"]) == {"evidence_conflict", "evidence_consistent"}
    assert m["skipped_by_kind"] == {"invalid_record": 3, "unresolved_evidence": 2}
    kinds = {i["kind"] for i in m["inputs"]}
    assert kinds == {"fever_claims", "fever_wiki_pages"} and len(m["inputs"]) == 4
    assert all(len(i["sha256"]) == 64 and i["size"] == Path(i["path"]).stat().st_size for i in m["inputs"])
    assert json.loads((built[0] / "manifest.json").read_text()) == m
    assert "| instances |" in (built[0] / "README.md").read_text()


def test_bad_records_are_listed_with_file_and_line(built):
    skipped = {(Path(s["file"]).name, s["line"]): s for s in built[1]["skipped"]}
    assert set(skipped) == set(BAD)
    for key, text in BAD.items():
        assert text in skipped[key]["reason"], skipped[key]
        assert Path(skipped[key]["file"]) == FIXTURE / key[0]


def test_strict_build_stops_at_the_first_structural_error(tmp_path):
    with pytest.raises(DataError, match=r"train.jsonl:13: invalid JSON .*--skip-invalid"):
        build_data(fixture_config(skip_invalid=False), tmp_path)
    assert not (tmp_path / "manifest.json").exists()


def test_nei_claims_become_not_enough_info_instances(built):
    nei = [i for i in all_instances(built[2]) if i.answer == "not enough info"]
    assert {(i.meta["source_file"], i.meta["line"]) for i in nei} == NEI
    for inst in nei:
        assert inst.task == "evidence_conflict" and inst.relations == ()
        assert inst.meta["user_label"] in ("supported", "refuted")
        assert not [f for f in inst.facts if f.role == "gold"]
        shown = [f for f in inst.facts if f.role == "support"]  # retrieved, undeciding evidence of other claims
        assert 1 <= len(shown) <= 2 and all(f.kind == "evidence" for f in shown)


def test_no_group_in_two_splits(built):
    _, m, splits = built
    where = defaultdict(set)
    for split, instances in splits.items():
        for inst in instances:
            where[inst.meta["group"]].add(split)
    assert len(where) == USED + len(NEI)
    assert all(len(s) == 1 for s in where.values())
    assert all(splits[s] for s in SPLITS)
    assert sum(m["counts"]["groups_per_split"].values()) == USED + len(NEI)


def test_distractors_come_from_other_claims_of_the_same_split(built):
    splits = built[2]
    for split, instances in splits.items():
        texts_in_split = {f.text for i in instances for f in i.facts if f.role in ("gold", "conflict", "support")}
        for inst in instances:
            distractors = [f for f in inst.facts if f.role == "distractor"]
            assert len(distractors) <= 4 and len({f.text for f in inst.facts}) == len(inst.facts)
            claim = claim_of(inst).rstrip(".").replace('"', "'")
            assert all(claim not in f.text for f in distractors)
            for f in distractors:
                if f.kind == "evidence":
                    assert f.text in texts_in_split, (split, f.text)
    counts = Counter(len([f for f in i.facts if f.role == "distractor"]) for i in all_instances(splits))
    assert set(counts) >= {2, 3, 4}


def test_parquet_round_trip_matches_jsonl(built):
    out, _, splits = built
    for split in SPLITS:
        rows = [json.loads(line) for line in (out / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()]
        assert [Instance.from_dict(r) for r in rows] == splits[split]
        assert [i.to_dict() for i in splits[split]] == rows
    ids = [i.id for i in all_instances(splits)]
    assert len(set(ids)) == len(ids)
    hf = load_from_disk(str(out / "hf"))
    assert {s: len(hf[s]) for s in SPLITS} == {s: len(splits[s]) for s in SPLITS}


def test_instances_follow_the_contract(built):
    for inst in all_instances(built[2]):
        assert inst.labels == LABELS and inst.answer_kind == "label" and inst.options == ()
        assert inst.question == claim_question(claim_of(inst))
        assert [f.id for f in inst.facts] == [f"F{n}" for n in range(1, len(inst.facts) + 1)]
        assert all(f.scope == "global" for f in inst.facts)
        meta = inst.meta
        assert meta["group"] == f"fever:{meta['claim_id']}"
        assert meta["source_file"] in ("train.jsonl", "shared_task_dev.jsonl")
        assert all(v is not None for v in meta.values())


def claim_of(inst: Instance) -> str:
    return inst.question.split("Claim: ", 1)[1]


def rendered(perspective: str, claim: str, claim_is_true: bool) -> set[str]:
    quoted = claim.rstrip(".").replace('"', "'")
    return {t.format(claim=quoted, verdict=yes if claim_is_true else no) for t, yes, no in TEMPLATES[perspective]}


def test_user_memory_conflicts_with_or_agrees_with_the_evidence(built):
    # Which fact the evidence contradicts is the answer key: it is in roles and meta, never in relations.
    positions = Counter()
    tasks = Counter()
    for inst in all_instances(built[2]):
        if inst.answer == "not enough info":
            continue
        tasks[(inst.task, inst.perspective)] += 1
        user = [f for f in inst.facts if f.role in ("conflict", "support")]
        gold = [f for f in inst.facts if f.role == "gold"]
        assert len(user) == 1 and len(gold) >= 1
        user = user[0]
        assert user.kind == PERSPECTIVE_KINDS[inst.perspective]
        assert all(f.kind == "evidence" for f in gold)
        assert inst.relations == () and inst.meta["user_fact"] == user.id
        claim_is_true = inst.answer == "supported"
        if inst.task == "evidence_conflict":
            assert user.role == "conflict" and inst.meta["user_label"] != inst.answer
            assert user.text in rendered(inst.perspective, claim_of(inst), not claim_is_true)
        else:
            assert inst.task == "evidence_consistent" and user.role == "support"
            assert inst.meta["user_label"] == inst.answer
            assert user.text in rendered(inst.perspective, claim_of(inst), claim_is_true)
        positions[user.id] += 1
    # Position must not reveal the role.
    assert len(positions) >= 4 and max(positions.values()) < 0.5 * sum(positions.values())
    for p in ("belief", "identity", "expertise"):
        assert tasks[("evidence_conflict", p)] > 0 and tasks[("evidence_consistent", p)] > 0


def test_at_least_eight_templates_per_perspective_are_used(tmp_path):
    assert all(len(TEMPLATES[p]) >= 8 for p in PERSPECTIVE_KINDS)
    used = defaultdict(set)
    for seed in range(40):
        for p in PERSPECTIVE_KINDS:
            used[p].add(user_memory_text("fever", "1", "X is Y.", p, "supported", seed))
    assert all(len(v) >= 8 for v in used.values())


def test_escapes_are_decoded(built):
    splits = built[2]
    texts = [f.text for i in all_instances(splits) for f in i.facts if f.role == "gold"]
    assert not [t for t in texts if any(e in t for e in ESCAPES)]
    gold = {i.meta["claim_id"]: [f.text for f in i.facts if f.role == "gold"] for i in all_instances(splits)}
    assert gold["91011"] == [
        "Mercury (planet): Mercury is the smallest planet in the Solar System and the closest to the Sun."
    ]
    assert gold["91013"] == [
        "Halo: Combat Evolved: Halo: Combat Evolved is a 2001 military science fiction "
        "first-person shooter video game developed by Bungie and published by Microsoft Game "
        "Studios."
    ]
    assert gold["92011"] == [
        "Python (programming language): Blocks are delimited by indentation rather than by curly brackets ({})."
    ]
    assert gold["92002"] == [
        "Mount Kilimanjaro: Its summit, Uhuru Peak on Kibo, rises to about 5,895 metres (19,341 ft) above sea level."
    ]
    assert gold["91028"] == ["Reykjavík: Reykjavík is the capital and largest city of Iceland."]
    assert gold["91049"] == [
        '"Weird Al" Yankovic: He is known for humorous songs that parody popular music, often played on the accordion.'
    ]
    assert fever_source.decode_title("Savages_-LRB-2012_film-RRB-") == "Savages (2012 film)"
    assert fever_source.decode_sentence("Tokyo -LSB- x -RSB- is -LCB- y -RCB- ") == "Tokyo [x] is {y}"


def test_first_resolving_evidence_set_is_used(built):
    splits = built[2]
    meta = {i.meta["claim_id"]: i.meta for i in all_instances(splits)}
    # 91011: set 0 cites an empty row; 91050: set 0 cites a page absent from the dump.
    assert meta["91011"]["evidence_set"] == 1
    assert meta["91050"]["evidence_set"] == 1 and meta["91050"]["evidence_pages"] == ["Neil_Armstrong"]
    # Two-sentence sets from different pages become two evidence facts.
    assert meta["91043"]["evidence_set"] == 0
    assert meta["91043"]["evidence_pages"] == ["Mona_Lisa", "Louvre"] and meta["91043"]["evidence_sentences"] == [1, 0]
    for inst in by_claim(splits, 91015):
        assert sorted(f.text.split(":")[0] for f in inst.facts if f.role == "gold") == ["Alien (film)", "Ridley Scott"]


def test_build_is_deterministic(built, tmp_path):
    out, manifest, _ = built
    again = build_data(fixture_config(), tmp_path)
    assert again == manifest
    for name in [f"{s}.{ext}" for s in SPLITS for ext in ("parquet", "jsonl")] + ["manifest.json", "README.md"]:
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name


def test_only_cited_pages_are_kept(built):
    wiki = built[1]["source_stats"]["fever"]
    assert wiki["wiki_pages_scanned"] == 34 and wiki["wiki_pages_cited"] == 31 and wiki["wiki_pages_kept"] == 29
    assert wiki["wiki_pages_missing"] == ["Mount_Everest", "Neil_Armstrong_-LRB-astronaut-RRB-"]
    # Ids escaped in the dump ("Reykjav\u00edk", "\"Weird_Al\"…") must still be found.
    wanted = {"Tokyo", "Reykjavík", '"Weird_Al"_Yankovic', "Not_A_Page"}
    scan = fever_source.scan_wiki(FIXTURE / "wiki-pages", wanted, SkipLog(), progress=False)
    assert set(scan.pages) == wanted - {"Not_A_Page"}
    assert scan.pages_scanned == 34 and not scan.problems
    assert scan.pages["Tokyo"][1] == "The city was formerly known as Edo ."


def test_max_claims_stops_reading(tmp_path):
    m = build_data(fixture_config(max_claims=6), tmp_path)
    # Lines 1-6 are usable claims (line 6 is NOT ENOUGH INFO): reading stops before line 7.
    assert (m["records"]["per_file"][str(FIXTURE / "train.jsonl")]) == {"read": 6, "used": 6, "skipped": 0}
    stopped = m["stopped_early"]["fever"]
    assert stopped["next_line"] == 7 and Path(stopped["file"]).name == "train.jsonl"
    assert m["source_stats"]["fever"]["wiki_pages_kept"] == 2  # Mount_Kilimanjaro and Marie_Curie


def test_duplicate_claim_ids_are_skipped(tmp_path):
    src = tmp_path / "fever"
    shutil.copytree(FIXTURE / "wiki-pages", src / "wiki-pages")
    lines = (FIXTURE / "train.jsonl").read_text(encoding="utf-8").splitlines()
    (src / "claims.jsonl").write_text("\n".join([lines[0], lines[1], lines[2], lines[0]]) + "\n", encoding="utf-8")
    m = build_data(fixture_config(dir=str(src), claim_files=["claims.jsonl"]), tmp_path / "o")
    assert m["records"]["per_file"][str(src / "claims.jsonl")] == {"read": 4, "used": 3, "skipped": 1}
    assert m["skipped"][0]["line"] == 4 and "duplicate claim id 91001" in m["skipped"][0]["reason"]
    with pytest.raises(DataError, match="claims.jsonl:4: duplicate claim id 91001"):
        build_data(fixture_config(dir=str(src), claim_files=["claims.jsonl"], skip_invalid=False), tmp_path / "s")


def test_load_split_names_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="validation.parquet"):
        load_split(tmp_path, "validation")


def test_config_yaml(tmp_path):
    cfg = load_data_config(CONFIG)
    fever = cfg.sources["fever"]
    assert fever.dir == "tests/fixtures/fever" and fever.claim_files == ["train.jsonl", "shared_task_dev.jsonl"]
    assert cfg.skip_invalid and list(cfg.sources) == ["fever"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("fever: {dir: x, claim_file: [a]}\n")
    with pytest.raises(ValueError, match=r"fever: unknown key\(s\) \['claim_file'\]"):
        load_data_config(bad)
    bad.write_text("fever: {dir: x}\nsplits: {}\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['splits'\]"):
        load_data_config(bad)
    bad.write_text("fever: {dir: x}\nsplit_ratios: {train: 0.5, validation: 0.1, test: 0.1}\n")
    with pytest.raises(ValueError, match="sum to 1"):
        load_data_config(bad)
    bad.write_text("seed: 1\n")
    with pytest.raises(ValueError, match="names no source"):
        load_data_config(bad)


def test_relative_dir_resolves_from_the_project_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the config's relative path is not under the working directory here
    assert resolve_path(load_data_config(CONFIG).sources["fever"].dir).resolve() == FIXTURE


def test_assign_splits_by_group():
    keys = [f"fever:{n}" for n in range(100)]
    a = assign_splits(keys + keys[:10], seed=3)
    assert a == assign_splits(list(reversed(keys)), seed=3)
    assert Counter(a.values()) == {"train": 80, "validation": 10, "test": 10}
    assert a != assign_splits(keys, seed=4)
    assert Counter(assign_splits(["a", "b", "c"]).values()) == {"train": 1, "validation": 1, "test": 1}
    assert split_sizes(7, {"train": 0.8, "validation": 0.1, "test": 0.1}) == {"train": 5, "validation": 1, "test": 1}
    assert split_sizes(2, {"train": 0.8, "validation": 0.1, "test": 0.1}) == {"train": 2, "validation": 0, "test": 0}


def test_strict_build_raises_at_each_bad_record_in_turn(tmp_path):
    """With the earlier bad records made harmless, a strict build stops at the next one, naming file:line and why."""
    src = tmp_path / "fever"
    shutil.copytree(FIXTURE / "wiki-pages", src / "wiki-pages")
    lines = (FIXTURE / "train.jsonl").read_text(encoding="utf-8").splitlines()
    harmless = '{{"id": {}, "verifiable": "NOT VERIFIABLE", "label": "NOT ENOUGH INFO", "claim": "X.", ' \
        '"evidence": [[[1, null, null, null]]]}}'  # fmt: skip
    # Malformed records are found while reading, unresolvable evidence only after the wiki scan.
    order = sorted(BAD.items(), key=lambda kv: ("wiki dump" in kv[1] or "has no sentence" in kv[1], kv[0][1]))
    # The harmless stand-ins are NEI claims all reading "X.": the structure probe rightly spots NEI by the question's
    # length, so the probe only warns here (this test is about record errors).
    config = fixture_config(dir=str(src), claim_files=["train.jsonl"], skip_invalid=False, shortcut_probe="warn")
    for (name, line), text in order:
        (src / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        with pytest.raises(DataError) as e:
            build_data(config, tmp_path / "o")
        assert str(e.value).startswith(f"{src / name}:{line}: ") and text in str(e.value), str(e.value)
        lines[line - 1] = harmless.format(990000 + line)
    (src / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    m = build_data(config, tmp_path / "o")
    assert m["records"]["skipped"] == 0


def test_hostile_claim_lines_are_skipped_and_listed_with_skip_invalid(tmp_path, monkeypatch):
    """Issue 56: a line over the record limit, JSON nested too deeply for the parser and a claim with a lone
    surrogate are invalid records: listed with their line and counted in the balance, the build goes on."""
    monkeypatch.setenv("MEMSTATE_MAX_RECORD_BYTES", "4000")
    src = tmp_path / "fever"
    shutil.copytree(FIXTURE / "wiki-pages", src / "wiki-pages")
    lines = (FIXTURE / "train.jsonl").read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    hostile = [
        json.dumps(first | {"id": 990001, "claim": "x" * 5000}),
        '{"id": 990002, "claim": ' + "[" * 1500 + "]" * 1500 + "}",
        json.dumps(first | {"id": 990003, "claim": "Tokyo \ud800 is big."}),  # written as the "\\ud800" escape
    ]
    (src / "claims.jsonl").write_text("\n".join(lines + hostile) + "\n", encoding="utf-8")
    m = build_data(fixture_config(dir=str(src), claim_files=["claims.jsonl"], shortcut_probe="warn"), tmp_path / "o")
    skipped = {s["line"]: s["reason"] for s in m["skipped"] if s["file"].endswith("claims.jsonl")}
    n = TRAIN_LINES
    assert skipped[n + 1].startswith("line of 5") and "over the 4000-byte limit" in skipped[n + 1]
    assert skipped[n + 2].startswith("invalid JSON (nested too deeply")
    assert skipped[n + 3] == "field 'claim': lone surrogate U+D800 at character 7 (not valid Unicode text)"
    balance = m["records"]["per_file"][str(src / "claims.jsonl")]
    assert balance["read"] == n + 3 and balance["skipped"] == len(skipped) == 5 + 3  # the fixture's own 5, and 3
