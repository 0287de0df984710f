"""SciFact reader on the hand-written fixtures in tests/fixtures/scifact (see its README for the line numbers)."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from memstate.data_build import scifact
from memstate.data_build.labels import LABELS
from memstate.data_build.records import SourceRead
from memstate.sources.skips import (
    SKIP_CONFLICTING,
    SKIP_DUPLICATE,
    SKIP_INVALID,
    SKIP_UNLABELED,
    SKIP_UNRESOLVED,
    DataError,
    SkipLog,
)

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "scifact"
TRAIN, DEV, TEST, CORPUS = "claims_train.jsonl", "claims_dev.jsonl", "claims_test.jsonl", "corpus.jsonl"
ALL = [TRAIN, DEV, TEST]
LINES = {TRAIN: 31, DEV: 8, TEST: 4, CORPUS: 23}
USED = {TRAIN: 24, DEV: 8, TEST: 0, CORPUS: 23}
BAD = {  # line of claims_train.jsonl → (skip kind, text the reason must contain, claim id or None)
    4: (SKIP_INVALID, "field 'claim' is missing", "11"),
    8: (SKIP_INVALID, "invalid JSON", None),
    12: (SKIP_CONFLICTING, "doc 21003987 → supported, doc 12076551 → refuted", "47"),
    15: (SKIP_UNRESOLVED, "evidence doc 31415926 is not in the corpus", "53"),
    19: (SKIP_UNRESOLVED, "evidence doc 11532908 has no sentence 9", "59"),
    23: (SKIP_INVALID, "field 'label' is 'MAYBE'", "65"),
    28: (SKIP_INVALID, "field 'cited_doc_ids' must be a list of ints, got str", "71"),
}
STRUCTURAL = sorted(n for n, (kind, _, _) in BAD.items() if kind != SKIP_CONFLICTING)


def read(files=ALL, src: Path = FIXTURE, skip_invalid: bool = True, **kw) -> tuple[SourceRead, SkipLog]:
    log = SkipLog(skip_invalid=skip_invalid)
    return scifact.read_scifact(src, files, log, **kw), log


@pytest.fixture(scope="module")
def full() -> tuple[SourceRead, SkipLog]:
    return read()


def by_id(r: SourceRead) -> dict:
    return {c.claim_id: c for c in r.items}


def assert_balanced(r: SourceRead, log: SkipLog) -> None:
    skipped = Counter(s.file for s in log.records)
    assert set(skipped) <= set(r.records_in)
    for f, n in r.records_in.items():
        assert n == r.records_used[f] + skipped[f], f


def fixture_copy(tmp_path: Path, claims: list[str], name: str = "claims.jsonl") -> Path:
    """A SciFact dir with the fixture corpus and the given claim lines."""
    shutil.copy(FIXTURE / CORPUS, tmp_path / CORPUS)
    (tmp_path / name).write_text("".join(line + "\n" for line in claims), encoding="utf-8")
    return tmp_path


def train_lines() -> list[str]:
    return (FIXTURE / TRAIN).read_text(encoding="utf-8").splitlines()


def claim_line(claim_id: int, evidence: object, cited: object, text: str = "A claim.") -> str:
    return json.dumps({"id": claim_id, "claim": text, "evidence": evidence, "cited_doc_ids": cited})


def test_counts_inputs_and_per_file_balance(full):
    r, log = full
    key = {name: str(FIXTURE / name) for name in LINES}
    assert r.source == "scifact" and len(r.items) == 32 and r.stopped_at is None
    assert r.records_in == {key[n]: LINES[n] for n in LINES}
    assert r.records_used == {key[n]: USED[n] for n in LINES}
    assert_balanced(r, log)
    assert Counter(c.label for c in r.items) == {"supported": 16, "refuted": 11, "not enough info": 5}
    assert r.stats["labels"] == {"not enough info": 5, "refuted": 11, "supported": 16}
    assert r.stats["cited_docs_missing"] == [99999901, 99999902] and r.stats["corpus_docs"] == 23
    assert [(i["path"], i["kind"]) for i in r.inputs] == [(key[CORPUS], "scifact_corpus")] + [
        (key[n], "scifact_claims") for n in ALL
    ]
    for i in r.inputs:
        data = Path(i["path"]).read_bytes()
        assert i["sha256"] == hashlib.sha256(data).hexdigest() and i["size"] == len(data)


def test_bad_records_are_listed_with_file_line_and_kind(full):
    skipped = {(Path(s.file).name, s.line): s for s in full[1].records}
    assert {line for name, line in skipped if name == TRAIN} == set(BAD)
    for line, (kind, text, claim_id) in BAD.items():
        s = skipped[(TRAIN, line)]
        assert s.file == str(FIXTURE / TRAIN) and s.kind == kind and s.record_id == claim_id
        assert text in s.reason, s
    assert not [s for s in full[1].records if Path(s.file).name in (DEV, CORPUS)]


def test_strict_mode_raises_at_the_first_bad_line():
    with pytest.raises(DataError, match=r"claims_train\.jsonl:4: field 'claim' is missing"):
        read([TRAIN], skip_invalid=False)


def test_strict_mode_raises_at_each_structural_line_in_turn(tmp_path):
    """With the earlier bad lines made harmless (a test claim: skipped, not structural), the next one raises."""
    lines = train_lines()
    for n in STRUCTURAL:
        src = fixture_copy(tmp_path, lines, TRAIN)
        with pytest.raises(DataError) as e:
            read([TRAIN], src, skip_invalid=False)
        assert str(e.value).startswith(f"{src / TRAIN}:{n}: ") and BAD[n][1] in str(e.value)
        lines[n - 1] = json.dumps({"id": 9000 + n, "claim": "Harmless."})
    r, log = read([TRAIN], fixture_copy(tmp_path, lines, TRAIN), skip_invalid=False)
    assert len(r.items) == 24 and Counter(s.kind for s in log.records) == {
        SKIP_CONFLICTING: 1,
        SKIP_UNLABELED: 6,
    }


def test_strict_mode_reads_clean_files():
    r, log = read([DEV, TEST], skip_invalid=False)
    assert len(r.items) == 8 and {s.kind for s in log.records} == {SKIP_UNLABELED}
    assert_balanced(r, log)


def test_test_claims_are_unlabeled_not_errors(full):
    test = [s for s in full[1].records if Path(s.file).name == TEST]
    assert [(s.line, s.record_id) for s in test] == [(1, "201"), (2, "204"), (3, "207"), (4, "210")]
    assert all(s.kind == SKIP_UNLABELED and s.reason == "SciFact test claims carry no label" for s in test)


def test_labels_are_normalized(full, tmp_path):
    claims = by_id(full[0])
    assert all(c.label in LABELS for c in claims.values())
    assert (claims["3"].label, claims["5"].label, claims["17"].label) == ("supported", "refuted", "not enough info")
    lower = [
        claim_line(1, {"1150": [{"sentences": [2], "label": "support"}]}, [1150]),
        claim_line(2, {"1150": [{"sentences": [2], "label": "contradict"}]}, [1150]),
        claim_line(3, {"1150": [{"sentences": [2], "label": "NOT ENOUGH INFO"}]}, [1150]),
    ]
    r, log = read(["claims.jsonl"], fixture_copy(tmp_path, lower))
    assert [c.label for c in r.items] == ["supported", "refuted"]
    assert log.records[0].line == 3 and "field 'label' is 'NOT ENOUGH INFO'" in log.records[0].reason


def test_string_doc_id_keys(full, tmp_path):
    claims = by_id(full[0])
    # Keys are strings in the file, ints in the corpus and in meta; the file's doc order is kept.
    assert claims["35"].meta["doc_ids"] == [12076551, 21003987]
    assert claims["62"].meta["doc_ids"] == [22450019, 13660125]
    assert [t.split(":")[0] for t in claims["62"].evidence] == [
        "Inhaled phage cocktail rescues mice from lethal Pseudomonas pneumonia",
        "Bacteriophage therapy against multidrug-resistant Pseudomonas aeruginosa lung infection in mice",
        "Bacteriophage therapy against multidrug-resistant Pseudomonas aeruginosa lung infection in mice",
    ]
    bad_keys = [
        claim_line(1, {"01150": [{"sentences": [2], "label": "SUPPORT"}]}, [1150]),
        claim_line(2, {"doc": [{"sentences": [2], "label": "SUPPORT"}]}, [1150]),
        '{"id": 3, "claim": "A.", "evidence": {"1150": [], "1150": [{"sentences": [2], "label": "SUPPORT"}]}, '
        '"cited_doc_ids": [1150]}',
    ]
    r, log = read(["claims.jsonl"], fixture_copy(tmp_path, bad_keys))
    assert not r.items and [s.kind for s in log.records] == [SKIP_INVALID] * 3
    reasons = [s.reason for s in log.records]
    assert "key '01150' is not a doc id" in reasons[0] and "key 'doc' is not a doc id" in reasons[1]
    assert "duplicate key '1150'" in reasons[2]


def test_evidence_sentences_are_ordered_deduplicated_and_capped(full):
    claims = by_id(full[0])
    vitd = "Vitamin D supplementation and upper respiratory infections in adolescents: a randomised trial"
    assert claims["5"].evidence == (
        f"{vitd}: The incidence of laboratory-confirmed upper respiratory infection did not differ between groups "
        "(risk ratio 0.97, 95% CI 0.81 to 1.16).",
        f"{vitd}: CONCLUSIONS Daily vitamin D3 did not reduce upper respiratory infections in adolescents with "
        "adequate baseline levels.",
    )
    assert claims["5"].meta["rationale_sentences"] == [[[5, 3]]] and claims["5"].meta["sentences_used"] == [[3, 5]]
    # A title's closing period is dropped before the colon.
    assert (
        claims["20"].evidence[0].startswith("Statin therapy and the risk of incident type 2 diabetes: a cohort study: ")
    )
    assert claims["86"].meta["sentences_used"] == [[2, 3]] and len(claims["86"].evidence) == 2
    assert claims["62"].meta["sentences_used"] == [[2], [2, 3]]
    tau = claims["50"]
    assert tau.meta["evidence_capped"] and tau.meta["sentences_used"] == [[2, 3, 4, 6], [4]]
    assert len(tau.evidence) == 5 <= scifact.MAX_EVIDENCE_SENTENCES
    assert all(len(c.evidence) <= scifact.MAX_EVIDENCE_SENTENCES for c in claims.values())
    assert all(not c.context for c in claims.values() if c.label != "not enough info")
    assert [c.claim_id for c in claims.values() if c.meta["evidence_capped"]] == ["50"]


def test_a_first_rationale_over_the_cap_is_cut(tmp_path):
    line = claim_line(1, {"15502736": [{"sentences": [7, 6, 5, 4, 3, 2, 1, 0], "label": "SUPPORT"}]}, [15502736])
    r, _ = read(["claims.jsonl"], fixture_copy(tmp_path, [line]))
    assert r.items[0].meta["sentences_used"] == [[0, 1, 2, 3, 4, 5]] and r.items[0].meta["evidence_capped"]


def test_nei_claims_carry_context_and_no_evidence(full):
    claims = by_id(full[0])
    nei = {cid: c for cid, c in claims.items() if c.label == "not enough info"}
    assert sorted(nei, key=int) == ["17", "38", "41", "44", "110"]
    assert all(c.evidence == () and c.context for c in nei.values())
    assert nei["17"].context == (
        "Gut microbiota composition after antibiotic exposure in infancy: Early-life antibiotic exposure may have "
        "lasting effects on the gut microbiota.",
        "Gut microbiota composition after antibiotic exposure in infancy: We sequenced stool samples from 240 "
        "infants at 6, 12 and 24 months of age.",
    )
    # 38 cites a doc missing from the corpus: the two present ones give context.
    assert nei["38"].meta["doc_ids"] == [14190243, 8234409] and len(nei["38"].context) == 4
    # 41 cites four docs: only the first three give context, two sentences each.
    assert nei["41"].meta["doc_ids"] == [20145583, 6702114, 12076551]
    assert nei["41"].meta["cited_doc_ids"] == [20145583, 6702114, 12076551, 21003987]
    assert nei["41"].meta["sentences_used"] == [[0, 1]] * 3 and len(nei["41"].context) == 6
    assert nei["41"].meta["rationale_sentences"] == [[], [], []]


def test_nei_claims_without_context_are_skipped(tmp_path):
    lines = [claim_line(1, {}, [99999901, 99999902]), claim_line(2, {}, [])]
    r, log = read(["claims.jsonl"], fixture_copy(tmp_path, lines))
    assert not r.items and [(s.line, s.kind) for s in log.records] == [(1, SKIP_UNRESOLVED), (2, SKIP_INVALID)]
    assert "[99999901, 99999902] are not in the corpus" in log.records[0].reason
    assert "field 'cited_doc_ids' is empty" in log.records[1].reason


def test_max_claims_stops_reading():
    # Lines 1-3, 5, 6 of the train file give claims (line 4 is broken): reading stops before line 7.
    r, log = read(max_claims=5)
    assert len(r.items) == 5 and r.stopped_at == {"file": str(FIXTURE / TRAIN), "next_line": 7}
    assert r.records_in == {str(FIXTURE / CORPUS): 23, str(FIXTURE / TRAIN): 6}
    assert [i["kind"] for i in r.inputs] == ["scifact_corpus", "scifact_claims"]
    assert [s.line for s in log.records] == [4]
    assert_balanced(r, log)
    # The cap met at the end of a file: the next file is not read.
    r, log = read(max_claims=24)
    assert r.stopped_at == {"file": str(FIXTURE / DEV), "next_line": 1} and str(FIXTURE / DEV) not in r.records_in
    # Nothing left unread: no stop.
    r, _ = read([TRAIN, DEV], max_claims=32)
    assert len(r.items) == 32 and r.stopped_at is None
    with pytest.raises(ValueError, match="max_claims"):
        read(max_claims=-1)


def test_duplicate_claim_ids_are_skipped(tmp_path):
    lines = train_lines()
    src = fixture_copy(tmp_path, [lines[0], lines[1], lines[0]])
    r, log = read(["claims.jsonl"], src)
    assert len(r.items) == 2 and [(s.line, s.kind) for s in log.records] == [(3, SKIP_DUPLICATE)]
    assert f"duplicate claim id 3 (first at {src / 'claims.jsonl'}:1)" in log.records[0].reason
    with pytest.raises(DataError, match=r"claims\.jsonl:3: duplicate claim id 3"):
        read(["claims.jsonl"], src, skip_invalid=False)


def test_bad_corpus_lines_are_skipped_with_the_field_named(tmp_path):
    docs = (FIXTURE / CORPUS).read_text(encoding="utf-8").splitlines()
    bad = [
        '{"doc_id": 1, "title": "T", "abstract": ["A."]',
        json.dumps({"doc_id": "2", "title": "T", "abstract": ["A."], "structured": False}),
        json.dumps({"doc_id": 3, "title": "T", "abstract": "A.", "structured": False}),
        json.dumps({"doc_id": 4, "title": "T", "abstract": ["A."], "structured": "no"}),
        json.dumps({"doc_id": 5, "abstract": ["A."], "structured": False}),
        docs[0],
    ]
    (tmp_path / CORPUS).write_text("\n".join(docs + bad) + "\n", encoding="utf-8")
    shutil.copy(FIXTURE / DEV, tmp_path / DEV)
    r, log = read([DEV], tmp_path)
    assert len(r.items) == 8 and r.records_in[str(tmp_path / CORPUS)] == 29
    assert [(s.line, s.kind) for s in log.records] == [(n, SKIP_INVALID) for n in range(24, 29)] + [
        (29, SKIP_DUPLICATE)
    ]
    reasons = [s.reason for s in log.records]
    for n, text in enumerate(["invalid JSON", "'doc_id'", "'abstract'", "'structured'", "field 'title' is missing"]):
        assert text in reasons[n], reasons[n]
    assert f"duplicate doc_id 1150 (first at {tmp_path / CORPUS}:1)" in reasons[5]
    assert_balanced(r, log)
    with pytest.raises(DataError, match=rf"{CORPUS}:24: invalid JSON"):
        read([DEV], tmp_path, skip_invalid=False)


def test_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="claims_nope.jsonl"):
        read(["claims_nope.jsonl"])
    with pytest.raises(FileNotFoundError, match="corpus.jsonl"):
        read([TRAIN], tmp_path)


def test_items_follow_the_record_contract(full):
    for c in full[0].items:
        assert c.source == "scifact" and c.group == f"scifact:{c.claim_id}" and c.claim_id.isdigit()
        assert c.file in (TRAIN, DEV) and c.line >= 1 and c.claim == " ".join(c.claim.split())
        assert set(c.meta) == {"doc_ids", "cited_doc_ids", "rationale_sentences", "sentences_used", "evidence_capped"}
        assert len(c.meta["rationale_sentences"]) == len(c.meta["sentences_used"]) == len(c.meta["doc_ids"])
        assert json.loads(json.dumps(c.meta)) == c.meta and "null" not in json.dumps(c.meta)
        assert len(set(c.evidence)) == len(c.evidence) and len(set(c.context)) == len(c.context)
    assert (by_id(full[0])["110"].file, by_id(full[0])["110"].line) == (DEV, 4)


def test_meta_round_trips_through_arrow(full):
    datasets = pytest.importorskip("datasets")
    rows = [{"meta": c.meta} for c in full[0].items]
    assert datasets.Dataset.from_list(rows).to_list() == rows


def test_reading_is_deterministic(full):
    again, log = read()
    assert again == full[0] and log.records == full[1].records


def test_hostile_claim_lines_are_invalid_records(tmp_path, monkeypatch):
    """Issue 56: a line over the record limit (not read whole), JSON nested too deeply for the parser and a claim
    with a lone surrogate are skipped and listed like any other invalid record; strict mode names the first."""
    monkeypatch.setenv("MEMSTATE_MAX_RECORD_BYTES", "4000")
    good = train_lines()[0]
    lines = [good, claim_line(901, {}, [], "x" * 5000), '{"id": 902, "claim": ' + "[" * 1500 + "]" * 1500 + "}"]
    lines.append(claim_line(903, {}, [1150], "A \ud800 claim."))  # json.dumps writes the "\\ud800" escape
    src = fixture_copy(tmp_path, lines)
    r, log = read(["claims.jsonl"], src)
    assert len(r.items) == 1
    assert [(s.line, s.kind) for s in log.records] == [(2, SKIP_INVALID), (3, SKIP_INVALID), (4, SKIP_INVALID)]
    reasons = [s.reason for s in log.records]
    assert reasons[0].startswith("line of 5062 bytes is over the 4000-byte limit of one record")
    assert reasons[1].startswith("invalid JSON (nested too deeply")
    assert reasons[2] == "field 'claim': lone surrogate U+D800 at character 3 (not valid Unicode text)"
    assert_balanced(r, log)
    with pytest.raises(DataError, match=r"claims.jsonl:2: line of 5062 bytes is over the 4000-byte limit"):
        read(["claims.jsonl"], src, skip_invalid=False)
