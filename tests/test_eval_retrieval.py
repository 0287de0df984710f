"""``memstate eval retrieval`` (evaluate/retrieval.py) on the hand-made LoCoMo fixture with the hashing embedder:
evidence scoring, the BM25-over-turns baseline, naive at equal facts, the report files, reused stores, and errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from memstate.cli import main
from memstate.errors import ConfigError
from memstate.evaluate.retrieval import (
    BM25,
    TokenCounter,
    TurnIndex,
    evaluate_retrieval,
    make_parser,
    run,
    score,
    write_report,
)
from memstate.memory import Backend, MemoryStore, register
from memstate.memory.backends import unregister
from memstate.sources.locomo import read_locomo

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "locomo" / "locomo_sample.json"
PAINT = "What did Ben paint?"  # evidence D2:2 (the lighthouse image) and D2:3


def _pick_d22(query):
    """A toy backend: the fact stored from turn D2:2, whatever the question and k."""
    return [f.id for f in query.store.facts() if f.source == "D2:2"], {}


def _top1(query):
    """A toy backend: naive's nearest fact, whatever k (fewer facts than naive@k returns)."""
    return [ref for ref, _ in query.store.nearest(query.vector, 1)], {}


@pytest.fixture
def toy_backends():
    register(Backend("pick_d22", "toy", _pick_d22, ("none", "none"), relations=False))
    register(Backend("top1", "toy", _top1, ("none", "none"), relations=False))
    yield
    unregister("pick_d22")
    unregister("top1")


def _evaluate(tmp_path: Path, backends: list[str], ks: list[int], **kwargs) -> dict:
    return evaluate_retrieval(FIXTURE, tmp_path / "out", backends=backends, ks=ks, embedder="hash-64",
                              n_resamples=200, **kwargs)  # fmt: skip


def test_score_counts_evidence_turns_among_the_retrieved_sources():
    assert score(("D2:2", "D2:3"), ["D2:2", "D1:1"]) == {"recall": 0.5, "hit": 1.0, "complete": 0.0}
    assert score(("D2:2", "D2:3"), ["D2:3", None, "D2:2"]) == {"recall": 1.0, "hit": 1.0, "complete": 1.0}
    assert score(("D1:2",), []) == {"recall": 0.0, "hit": 0.0, "complete": 0.0}


def test_one_of_two_evidence_turns_retrieved_is_half_recall_a_hit_and_not_complete(tmp_path, toy_backends):
    result = _evaluate(tmp_path, ["pick_d22"], [1])
    (paint,) = [r for r in result["questions"] if r["question"] == PAINT]
    row = paint["systems"]["pick_d22@1"]
    assert (row["recall"], row["hit"], row["complete"], row["n_facts"]) == (0.5, 1.0, 0.0, 1)
    assert row["sources"] == ["D2:2"]
    text = _stored_text(tmp_path / "out" / "stores" / "conv-t1.sqlite")
    assert row["text_tokens"] == TokenCounter().count_text(text)
    assert row["tokens"] == TokenCounter().count_text(f"[F1] {text}")  # as the prompt shows it: the date once
    assert result["results"]["pick_d22@1"]["n"] == 3  # the category-5 question is left out by default


def _stored_text(path: Path, source: str = "D2:2") -> str:
    with MemoryStore(path) as store:
        (fact,) = [f for f in store.facts() if f.source == source]
    return fact.text


def test_bm25_over_turns_finds_a_turn_by_a_rare_word_and_survives_punctuation():
    index = TurnIndex(read_locomo(FIXTURE).samples[0])
    (top, *_) = index.search("Who sleeps on a keyboard?", 3)
    assert top == ("D1:3", "Ana: Yes! She is called Miso and she sleeps on my keyboard.")
    assert index.search('"lighthouse" - NOT (NEAR) OR?', 1)[0][0] == "D2:2"  # found by its image caption
    assert index.search("zebra quantum", 5) == [] and index.search("?!", 5) == []


def test_tokens_of_the_joined_block_are_the_sum_of_the_texts():
    tokens = TokenCounter()
    texts = ["Ben (10:04 am on 3 March, 2023): Busy, but good.", "word " * 300, "Ben (10:04 am on 3 March, 2023): x"]
    assert tokens(texts) == tokens.count_text("\n".join(texts)) > 300  # not cut at the model's 128 tokens


def test_equal_facts_compares_with_naive_at_the_backends_fact_count(tmp_path, toy_backends):
    result = _evaluate(tmp_path, ["top1", "naive"], [5])
    res = result["results"]
    # naive@5 retrieves more of the evidence than one fact does: comparing at k instead of equal facts would differ.
    assert res["naive@5"]["recall"] > res["top1@5"]["recall"]
    for rec in result["questions"]:
        eq = rec["equal_facts"]["top1@5"]
        assert eq["naive_k"] == rec["systems"]["top1@5"]["n_facts"] == 1
        assert eq["recall"] == rec["systems"]["top1@5"]["recall"]
        assert "naive@5" not in rec["equal_facts"]
    eq = result["comparisons"]["top1@5"]["equal_facts"]
    assert eq["n_facts"] == 1.0 and eq["recall_diff"]["mean"] == 0.0 and eq["naive_recall"] == res["top1@5"]["recall"]
    assert "equal_facts" not in result["comparisons"]["naive@5"]


def test_cli_writes_the_report_with_a_bm25_row_per_k_and_reuses_its_stores(tmp_path, capsys):
    out = tmp_path / "report"
    argv = ["--log-level", "ERROR", "eval", "retrieval", str(FIXTURE), "--out", str(out), "--embedder", "hash-64",
            "--k", "1", "3", "--bootstrap-resamples", "100"]  # fmt: skip
    assert main(argv) == 0
    data = json.loads((out / "retrieval.json").read_text())
    assert set(data) == {"results", "per_category", "comparisons", "coverage", "data", "settings"}
    systems = [f"{b}@{k}" for k in ("1", "3", "565tok") for b in ("evomem", "naive", "clag", "memsearch", BM25)]
    assert list(data["results"]) == systems
    assert set(data["comparisons"]["evomem@565tok"]) == {
        f"{m}_vs_{s}" for m in ("recall", "hit") for s in (BM25, "naive")
    }
    assert data["settings"]["budgets_tokens"] == [565]
    for row in data["results"].values():
        assert {"recall", "hit", "complete", "tokens", "p50_ms", "p95_ms", "n_facts", "n"} <= set(row)
        assert row["n"] == 3 and 0 <= row["recall"] <= 1 and row["tokens"] > 0
    assert 1 <= data["results"][f"{BM25}@3"]["n_facts"] <= 3  # only turns sharing a content word with the question
    assert set(data["comparisons"]["memsearch@3"]) == {f"recall_vs_{BM25}", f"hit_vs_{BM25}", "equal_facts"}
    assert data["coverage"]["fraction"] == 1.0 and data["coverage"]["evidence_turns"] == 4  # D1:2, D2:2, D2:3, D1:3
    assert data["data"]["skipped"] == {"other_category": 1, "no_valid_evidence": 0, "broken_evidence_ids": 2}
    assert set(data["per_category"]) == {"1", "2", "4"} and data["per_category"]["4"]["name"] == "single-hop"
    md = (out / "retrieval.md").read_text()
    assert f"| {BM25}@1 |" in md and f"| {BM25}@3 |" in md and "evidence coverage" in md and "equal facts" in md
    assert f"| {BM25}@565tok |" in md and "## Against naive at the same token budget" in md
    assert (out / "retrieval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len((out / "retrieval_questions.jsonl").read_text().splitlines()) == 3
    assert "| naive@3 |" in capsys.readouterr().out
    with MemoryStore(out / "stores" / "conv-t1.sqlite") as store:
        first = len(store)
    assert main(argv[:-2] + ["--categories", "1", "2", "3", "4", "5"]) == 0  # the same stores, nothing ingested again
    with MemoryStore(out / "stores" / "conv-t1.sqlite") as store:
        assert len(store) == first == 6
    data = json.loads((out / "retrieval.json").read_text())
    assert data["data"]["skipped"]["no_valid_evidence"] == 1  # the category-5 question's only id names no turn


def test_a_budget_row_takes_facts_in_order_while_they_fit(tmp_path):
    result = _evaluate(tmp_path, ["naive"], [1], budgets=[25, 60])
    for rec in result["questions"]:
        small, large = rec["systems"]["naive@25tok"], rec["systems"]["naive@60tok"]
        assert 0 < small["tokens"] <= 25 and small["tokens"] < large["tokens"] <= 60
        assert small["n_facts"] < large["n_facts"]
        for budget in (25, 60):
            bm25 = rec["systems"][f"{BM25}@{budget}tok"]
            assert bm25["tokens"] <= budget and bm25["n_facts"] >= 1
    ci = result["comparisons"]["naive@60tok"][f"recall_vs_{BM25}"]
    assert ci is not None and "naive_recall" not in result["comparisons"]["naive@60tok"]


def test_stores_of_another_extractor_or_fact_format_are_not_reused(tmp_path):
    _evaluate(tmp_path, ["naive"], [1])
    with pytest.raises(ConfigError, match="built with extractor 'turns', not 'rule'"):
        _evaluate(tmp_path, ["naive"], [1], extractor="rule")
    settings = tmp_path / "out" / "stores" / "ingest.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "fact_format": None}))  # an older version's
    with pytest.raises(ConfigError, match="built with fact_format None, not 2"):
        _evaluate(tmp_path, ["naive"], [1])


@pytest.mark.parametrize("content", ["{not json", None])
def test_a_bad_or_missing_file_is_one_error_line_naming_it(tmp_path, capsys, content):
    data = tmp_path / "broken_locomo.json"
    if content is not None:
        data.write_text(content)
    out = tmp_path / "out"
    assert main(["eval", "retrieval", str(data), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memstate eval retrieval: error: ") and "broken_locomo.json" in err
    assert "Traceback" not in err and not out.exists()


def test_unknown_backend_and_bad_k_are_config_errors(tmp_path, capsys):
    assert main(["eval", "retrieval", str(FIXTURE), "--out", str(tmp_path / "o"), "--backends", "bm42"]) == 2
    assert "unknown memory backend 'bm42'" in capsys.readouterr().err
    assert main(["eval", "retrieval", str(FIXTURE), "--out", str(tmp_path / "o"), "--k", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_a_relations_section_goes_into_json_and_markdown(tmp_path, capsys):
    args = make_parser("memstate eval retrieval").parse_args(
        [str(FIXTURE), "--out", str(tmp_path), "--backends", "naive", "--k", "1", "--embedder", "hash-64"]
    )
    run(args, relations={"precision": 0.75, "markdown": "| relation | precision |\n|---|---|\n| SUPERSEDES | 0.75 |"})
    assert json.loads((tmp_path / "retrieval.json").read_text())["relations"]["precision"] == 0.75
    md = (tmp_path / "retrieval.md").read_text()
    assert "## Relations" in md and "| SUPERSEDES | 0.75 |" in md
    result = json.loads((tmp_path / "retrieval.json").read_text())
    write_report({**result, "relations": {"precision": 0.5}}, tmp_path / "plain")
    assert "- precision: 0.5" in (tmp_path / "plain" / "retrieval.md").read_text()


def test_relations_flag_adds_the_extractors_supersedes_precision_to_the_report(tmp_path, capsys):
    rows = FIXTURE.parents[1] / "memsyco" / "valid_memory_selection_relations.jsonl"
    out = tmp_path / "report"
    argv = ["--log-level", "ERROR", "eval", "retrieval", str(FIXTURE), "--out", str(out), "--embedder", "hash-64",
            "--k", "1", "--backends", "naive", "--bootstrap-resamples", "50", "--relations", str(rows)]  # fmt: skip
    assert main(argv) == 0
    data = json.loads((out / "retrieval.json").read_text())
    sup = data["relations"]["supersedes"]
    assert data["relations"]["rows"] == 3 and sup["drawn"] >= 1 and 0 <= sup["precision"] <= 1
    assert f"precision {sup['precision']}" in (out / "retrieval.md").read_text()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(rows.read_text(encoding="utf-8").splitlines()[0] + "\nnot json\n", encoding="utf-8")
    shutil.copy(rows.parent / "schema.json", tmp_path / "schema.json")  # validated by the MemSyco reader
    argv[argv.index(str(rows))] = str(bad)
    assert main(argv) == 2  # a user error naming the file and line
    assert f"{bad}:2: invalid JSON" in capsys.readouterr().err
