"""Relations worth trusting: SUPERSEDES only between two statements of one person about one thing (drawn by the
default TurnExtractor, refused by the store across speakers), and the scorer of their precision on MemSyco's
valid_memory_selection rows (hand-made rows in the benchmark's on-disk format, tests/fixtures/memsyco). Hashing
embedder; the extractor's lexical same-thing test."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from memstate.evaluate import relations
from memstate.evaluate.relations import label_turns, relation_scores
from memstate.memory import HashEmbedder, MemoryStore, RuleExtractor, Turn, memsyco_sessions
from memstate.memory.records import Proposal, RelationProposal
from memstate.memory.turn_extractor import TurnExtractor
from memstate.memory.validate import check_relations

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "memsyco" / "valid_memory_selection_relations.jsonl"
EMB = HashEmbedder(384)
OLD = (
    "I organised a jam session last spring and it was chaotic and unproductive, with musicians of every skill "
    "level clashing. I hated how messy those jam sessions felt."
)
NEW = (
    "You know, I've changed my mind about jam sessions. I used to hate the chaotic ones, but now I love how messy "
    "jam sessions with musicians of every skill level spark creativity."
)


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, FIXTURE.read_text(encoding="utf-8").splitlines())}


def test_a_reversal_supersedes_the_earlier_statement_and_scores_correct(rows, tmp_path):
    row = rows["rel_reversal"]
    with MemoryStore(tmp_path / "s.db", EMB) as store:
        (report,) = store.ingest(memsyco_sessions(row), TurnExtractor())
        facts = {f.id: f for f in store.facts()}
        ((src, rel, dst),) = store.relations()
    assert report.rejected == ()
    assert rel == "SUPERSEDES" and facts[src].quote == NEW and facts[dst].quote == OLD
    assert facts[src].kind == facts[dst].kind == "preference"  # the old view's narrative is stored as a stance
    assert not facts[dst].current and facts[src].current
    out = relation_scores([row], TurnExtractor, EMB)
    assert out["rows"] == out["matched_rows"] == 1
    assert {k: out["supersedes"][k] for k in ("drawn", "correct", "precision", "rows_correct", "recall")} == {
        "drawn": 1, "correct": 1, "precision": 1.0, "rows_correct": 1, "recall": 1.0,
    }  # fmt: skip
    json.dumps(out)  # a plain dict


def test_traversal_is_measured_per_depth_on_the_labelled_turns(rows):
    row = rows["rel_reversal"]
    everything = relation_scores([row], TurnExtractor, EMB, budget_tokens=10_000)["traversal"]
    assert everything["rows"] == 1 and everything["budget_tokens"] == 10_000
    for depth in ("depth_0", "depth_2"):  # the whole dialogue fits: both items' turns, never the outdated alone
        assert everything[depth] == {"current": 1.0, "outdated": 1.0, "outdated_only": 0.0}
    nothing = relation_scores([row], TurnExtractor, EMB, budget_tokens=1)["traversal"]
    assert nothing["depth_2"] == {"current": 0.0, "outdated": 0.0, "outdated_only": 0.0}
    assert nothing["current_depth_2_minus_0"]["mean"] == 0.0
    assert "traversal" not in relation_scores([row], TurnExtractor, EMB)


def test_the_matcher_labels_the_outdated_turn_before_the_current_one(rows):
    row = rows["rel_reversal"]
    users = [t["content"] for t in row["dialogue"] if t["role"] == "user"]
    current, outdated = (i["content"] for s in ("current", "outdated") for i in row["memory"]["items"]
                         if i["status"] == s)  # fmt: skip
    assert label_turns(users, current, outdated, EMB) == {1: "outdated", 2: "current"}
    assert label_turns(users[:1], current, outdated, EMB) == {}  # the hike says neither


def test_no_edge_between_two_persons(rows, tmp_path):
    assert relation_scores([rows["rel_assistant_revises"]], TurnExtractor, EMB)["supersedes"]["drawn"] == 0
    ana, ben = Turn("user", OLD, speaker="Ana"), Turn("user", NEW, speaker="Ben")
    assert TurnExtractor().propose([ana, ben], []).relations == ()
    assert len(TurnExtractor().propose([ana, replace(ben, speaker="Ana")], []).relations) == 1


class _Fixed:
    """An extractor that proposes what it is given (facts from TurnExtractor, relations as told)."""

    def __init__(self, *relations: RelationProposal) -> None:
        self.relations = relations

    def propose(self, turns, context):
        facts = TurnExtractor().propose(turns, []).facts
        return Proposal(tuple(replace(f, kind="preference") for f in facts), relations=self.relations)


def test_the_store_refuses_an_edge_between_speakers(tmp_path):
    with MemoryStore(tmp_path / "s.db", EMB) as store:
        report = store.ingest_session(
            [Turn("user", OLD, speaker="Ana"), Turn("user", NEW, speaker="Ben")],
            _Fixed(RelationProposal("n2", "SUPERSEDES", "n1")),
        )
        assert [(r.what, r.reason) for r in report.rejected] == [("relation n2 SUPERSEDES n1", "different speakers")]
        (old,) = store.ingest_session([Turn("user", OLD, speaker="Ana")], _Fixed(), session_id="a").fact_ids
        report = store.ingest_session([Turn("user", NEW, speaker="Ben")], _Fixed(RelationProposal("n1", "SUPERSEDES",
                                      old)), session_id="b")  # fmt: skip
        assert [r.reason for r in report.rejected] == ["different speakers"]
        report = store.ingest_session([Turn("user", NEW, speaker="Ana")], _Fixed(RelationProposal("n1", "SUPERSEDES",
                                      old)), session_id="c")  # fmt: skip
        assert report.rejected == () and report.relations == 1 and store.relations()[-1][2] == old


def test_an_unknown_person_is_not_held_against_an_edge():
    kinds = {"n1": "preference", "m1": "preference"}
    args = ([RelationProposal("n1", "SUPERSEDES", "m1")], kinds.get, {}.get, lambda *e: False)
    ok, bad = check_relations(*args, person_of={"n1": "Ana"}.get)
    assert len(ok) == 1 and bad == []
    ok, bad = check_relations(*args, person_of={"n1": "Ana", "m1": "Ben"}.get)
    assert ok == [] and [r.reason for r in bad] == ["different speakers"]


def test_a_revision_about_another_thing_supersedes_nothing(rows):
    out = relation_scores([rows["rel_other_topic"]], TurnExtractor, EMB)
    assert out["matched_rows"] == 1 and out["supersedes"]["drawn"] == 0  # labels exist; no edge was drawn


def test_the_scorer_counts_a_wrong_edge_as_wrong(rows):
    row = rows["rel_reversal"]  # facts n1 hike, n2 old view, n3 revision (user turns only; assistants are n-less)
    keys = {f.quote: f.key for f in TurnExtractor().propose(memsyco_sessions(row)[0].turns, []).facts}
    hike, old, new = keys[row["dialogue"][1]["content"]], keys[OLD], keys[NEW]
    out = relation_scores([row], lambda: _Fixed(RelationProposal(old, "SUPERSEDES", new)), EMB)["supersedes"]
    assert (out["drawn"], out["correct"], out["precision"], out["recall"]) == (1, 0, 0.0, 0.0)
    assert out["wrong"] == {"outdated SUPERSEDES current": 1} and out["examples"][0]["row"] == "rel_reversal"
    both = _Fixed(RelationProposal(new, "SUPERSEDES", old), RelationProposal(new, "SUPERSEDES", hike))
    out = relation_scores([row], lambda: both, EMB)["supersedes"]
    assert (out["drawn"], out["correct"], out["precision"], out["recall"]) == (2, 1, 0.5, 1.0)
    assert out["wrong"] == {"current SUPERSEDES unmatched": 1}


def test_rule_extractor_keeps_to_one_speaker_and_needs_the_same_thing():
    boston = [Turn("user", "I'll catch you when I'm in Boston.", speaker="Ana"),
              Turn("user", "I can't wait to see more when I'm in Boston!", speaker="Ana")]  # fmt: skip
    assert RuleExtractor().propose(boston, []).relations == ()
    tea = [Turn("user", "I love green tea with honey and lemon.", speaker="Ana"),
           Turn("user", "I no longer love green tea with honey and lemon.", speaker="Ben")]  # fmt: skip
    assert RuleExtractor().propose(tea, []).relations == ()
    assert len(RuleExtractor().propose([tea[0], replace(tea[1], speaker="Ana")], []).relations) == 1
    # two shared topic words (green, tea) are not the same thing by the one relation rule (memory/relation_rule.py)
    short = [Turn("user", "I love green tea.", speaker="Ana"),
             Turn("user", "I no longer love green tea.", speaker="Ana")]  # fmt: skip
    assert RuleExtractor().propose(short, []).relations == ()


def test_cli_prints_the_scores_as_json(monkeypatch, capsys):
    monkeypatch.setattr("memstate.memory.embed.default_embedder", lambda: EMB)
    assert relations.main([str(FIXTURE), "--rows", ":1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"] == 1 and out["supersedes"]["correct"] == 1 and out["input"]["extractor"] == "turns"
