"""The memory store and the rule extractor: SUPERSEDES with traversal retrieval, CONFLICTS_WITH, whole-session
rejection of an invented quote, acyclic SUPERSEDES, edge and concept checks, immutability, reopening."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

import pytest

from memstate.memory import HashEmbedder, MemoryStore, RuleExtractor, StoreError, Turn, retrieve
from memstate.memory.records import ConceptEdit, FactProposal, Proposal, RelationProposal
from memstate.memory.rule_extractor import fact_kind
from memstate.memory.tokens import token_counter
from memstate.prompts import format_fact

TABLES = ("sessions", "facts", "fact_vectors", "relations", "concepts", "concept_facts")


@dataclass
class Scripted:
    """An extractor that proposes exactly what it is given (and records the context it saw)."""

    proposal: Proposal
    seen: list | None = None

    def propose(self, turns, context):
        self.seen = list(context)
        return self.proposal


def counts(path) -> dict[str, int]:
    with sqlite3.connect(path) as db:
        return {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in TABLES}


@pytest.fixture
def store(tmp_path):
    with MemoryStore(tmp_path / "user.db", HashEmbedder(256)) as s:
        yield s


def user(*texts: str) -> list[Turn]:
    return [Turn("user", t) for t in texts]


def test_later_preference_supersedes_and_traversal_returns_it(store):
    ex = RuleExtractor()
    # The one relation rule (memory/relation_rule.py): a stated change ("these days") about the same thing (4 shared
    # topic words: green, tea, honey, morning).
    first = store.ingest_session(
        user("I love green tea with honey and lemon in the morning."), ex, session_id="s1", time="2024-01-05"
    )
    # Filler on other topics, so the old preference is not trivially the only match.
    store.ingest_session(user("I ran a half marathon in Leeds last weekend.", "My cat is called Pepper."), ex)
    second = store.ingest_session(
        user("These days I prefer black coffee over green tea with honey in the morning."), ex, time="2024-06"
    )
    assert first.status == second.status == "committed"
    (old,), (new,) = first.fact_ids, second.fact_ids
    assert (new, "SUPERSEDES", old) in store.relations()
    facts = {f.id: f for f in store.facts()}
    assert facts[old].superseded_by == (new,) and not facts[old].current and facts[new].current
    assert facts[new].time == "2024-06" and facts[old].time == "2024-01-05"

    # The query matches only the old preference's words; k=1 seeds with it alone.
    ret = retrieve(store, "lemon", k=1)
    assert ret.store_ids[0] == old and new in ret.store_ids
    by_store = dict(zip(ret.store_ids, ret.facts, strict=True))
    assert by_store[old].role == "outdated" and by_store[new].role == "gold"
    assert [(r.src, r.type, r.dst) for r in ret.relations] == [(by_store[new].id, "SUPERSEDES", by_store[old].id)]
    assert [f.id for f in ret.facts] == [f"F{i}" for i in range(1, len(ret.facts) + 1)]

    naive = retrieve(store, "lemon", k=1, backend="naive")
    assert naive.store_ids == (old,) and naive.relations == ()


def test_a_later_seed_is_moved_up_beside_the_fact_it_supersedes(store):
    ex = RuleExtractor()
    (old,) = store.ingest_session(user("I love green tea with honey and lemon in the morning."), ex).fact_ids
    for food in ("cake", "sorbet", "pie"):  # outrank the new preference, which does not say lemon
        store.ingest_session(user(f"I love lemon {food} on a sunny summer afternoon at my aunt's old farm house."), ex)
    (new,) = store.ingest_session(user("These days I prefer black coffee over green tea with honey in the morning."),
                                  ex).fact_ids  # fmt: skip
    no_traversal = retrieve(store, "lemon", k=5, depth=0)
    assert no_traversal.store_ids[-1] == new and old in no_traversal.store_ids  # all five facts, the new one last
    ret = retrieve(store, "lemon", k=5)
    assert ret.store_ids[ret.store_ids.index(old) + 1] == new and len(ret.store_ids) == 5
    # A budget that holds only the first three facts of the ranking without traversal still brings the new one.
    budget = token_counter()([format_fact(f) for f in no_traversal.facts[:3]])  # as the prompt shows them
    got = retrieve(store, "lemon", budget_tokens=budget)
    assert old in got.store_ids and new in got.store_ids
    assert new not in retrieve(store, "lemon", budget_tokens=budget, depth=0).store_ids


def test_preference_chain_points_backwards(store):
    ex = RuleExtractor()
    ids = [
        store.ingest_session(user(text), ex).fact_ids[0]
        for text in (
            "I love spicy Thai food with extra chili.",
            "I no longer enjoy spicy Thai food with extra chili.",
            "These days I love spicy Thai food with extra chili again.",
        )
    ]
    assert store.relations() == [(ids[1], "SUPERSEDES", ids[0]), (ids[2], "SUPERSEDES", ids[1])]
    ret = retrieve(store, "spicy Thai food", k=1)
    assert set(ret.store_ids) == set(ids)  # two hops from whichever seed


def test_contradicting_belief_conflicts(store):
    ex = RuleExtractor()
    a = store.ingest_session(user("I believe strong coffee is bad for your heart health."), ex).fact_ids[0]
    b = store.ingest_session(user("Honestly, I don't think strong coffee is bad for heart health."), ex).fact_ids[0]
    assert store.relations() == [(b, "CONFLICTS_WITH", a)]
    facts = {f.id: f for f in store.facts()}
    assert facts[a].kind == facts[b].kind == "belief"
    assert facts[a].conflicts_with == (b,) and facts[a].current  # a conflict does not outdate either side
    ret = retrieve(store, "coffee heart", k=1)
    assert set(ret.store_ids) == {a, b} and [r.type for r in ret.relations] == ["CONFLICTS_WITH"]


def test_invented_quote_rejects_the_whole_session(store, tmp_path):
    store.ingest_session(user("I live in Leeds."), RuleExtractor(), session_id="ok")
    before = counts(store.path)
    bad = Proposal(
        facts=(
            FactProposal("n1", "The user loves tea.", "preference", "global", "I love tea", 0, ("tea",)),
            FactProposal("n2", "The user lives in Oslo.", "fact", "global", "I live in Oslo", 0),  # not said
        ),
        concepts=(ConceptEdit("CREATE", "tea"),),
        relations=(RelationProposal("n1", "CONFLICTS_WITH", "m1"),),
    )
    report = store.ingest_session(user("I love tea, and I moved last year."), Scripted(bad), session_id="bad")
    assert report.status == "rejected" and report.fact_ids == () and report.facts == 0
    assert "n2: quote not found verbatim" in report.rejected[0].reason
    assert counts(store.path) == before and store.sessions() == ["ok"]
    # The session can be ingested later by a better extractor.
    again = store.ingest_session(user("I love tea, and I moved last year."), RuleExtractor(), session_id="bad")
    assert again.status == "committed"


def test_quote_must_be_in_its_turn(store):
    turns = [Turn("user", "I love tea."), Turn("assistant", "Noted.")]
    p = Proposal(facts=(FactProposal("n1", "Loves tea.", "preference", "global", "I love tea", 1),))
    assert store.ingest_session(turns, Scripted(p)).status == "rejected"
    p = Proposal(facts=(FactProposal("n1", "Loves tea.", "preference", "global", "I  love\ntea", 0),))
    assert store.ingest_session(turns, Scripted(p)).status == "committed"  # whitespace runs compare as one space


def test_cycle_creating_supersedes_is_rejected(store):
    turns = user("I prefer tea. Now I prefer coffee.")
    p = Proposal(
        facts=(
            FactProposal("n1", "Prefers tea.", "preference", "global", "I prefer tea.", 0),
            FactProposal("n2", "Prefers coffee.", "preference", "global", "Now I prefer coffee.", 0),
        ),
        relations=(RelationProposal("n2", "SUPERSEDES", "n1"), RelationProposal("n1", "SUPERSEDES", "n2")),
    )
    report = store.ingest_session(turns, Scripted(p))
    assert report.status == "committed" and report.edges == (("m2", "SUPERSEDES", "m1"),)
    assert [(r.what, r.reason) for r in report.rejected] == [
        ("relation n1 SUPERSEDES n2", "would close a SUPERSEDES cycle")
    ]
    # Across sessions, through a longer path: m3 SUPERSEDES m2 SUPERSEDES m1, then m1 SUPERSEDES m3 closes it.
    p3 = Proposal(
        facts=(FactProposal("n1", "Prefers cocoa.", "preference", "global", "I prefer cocoa.", 0),),
        relations=(RelationProposal("n1", "SUPERSEDES", "m2"),),
    )
    assert store.ingest_session(user("I prefer cocoa."), Scripted(p3)).edges == (("m3", "SUPERSEDES", "m2"),)
    back = Proposal(relations=(RelationProposal("m1", "SUPERSEDES", "m3"),))
    report = store.ingest_session(user("Hello again."), Scripted(back))
    assert report.status == "committed" and report.rejected[0].reason == "would close a SUPERSEDES cycle"
    assert store.relations() == [("m2", "SUPERSEDES", "m1"), ("m3", "SUPERSEDES", "m2")]


def test_edges_need_existing_compatible_endpoints(store):
    turns = user("I love tea. I went to Rome last year.")
    p = Proposal(
        facts=(
            FactProposal("n1", "Loves tea.", "preference", "global", "I love tea.", 0),
            FactProposal("n2", "Went to Rome.", "experience", "global", "I went to Rome last year.", 0),
            FactProposal("n3", "Bad kind.", "opinion", "global", "I love tea.", 0),
        ),
        relations=(
            RelationProposal("n1", "SUPERSEDES", "m99"),
            RelationProposal("n1", "SUPERSEDES", "n2"),
            RelationProposal("n2", "SUPERSEDES", "n3"),
            RelationProposal("n1", "SUPPORTS", "n2"),
            RelationProposal("n1", "CONFLICTS_WITH", "n1"),
        ),
    )
    report = store.ingest_session(turns, Scripted(p))
    assert report.status == "committed" and report.fact_ids == ("m1", "m2") and report.edges == ()
    assert dict((r.what, r.reason) for r in report.rejected) == {
        "fact n3": "kind 'opinion' is not one of ['preference', 'fact', 'belief', 'experience', 'constraint']",
        "relation n1 SUPERSEDES m99": "no fact m99",
        "relation n1 SUPERSEDES n2": "a preference cannot SUPERSEDES a experience",
        "relation n2 SUPERSEDES n3": "endpoint n3 was rejected",
        "relation n1 SUPPORTS n2": "type 'SUPPORTS' is not one of ['SUPERSEDES', 'CONFLICTS_WITH']",
        "relation n1 CONFLICTS_WITH n1": "a fact cannot relate to itself",
    }


def test_one_turn_with_more_than_32_facts_keeps_32_and_reports_the_rest(store):
    text = " ".join(f"I like dish number {i}." for i in range(40))
    p = Proposal(
        facts=tuple(
            FactProposal(f"n{i}", f"Likes dish {i}.", "preference", "global", f"I like dish number {i}.", 0)
            for i in range(40)
        )
    )
    report = store.ingest_session(user(text), Scripted(p))  # one turn cannot be split further
    assert report.facts == 32 and len(report.rejected) == 8
    assert {r.reason for r in report.rejected} == {"over the limit of 32 facts per session"}


def test_a_session_with_more_than_32_facts_is_split_not_cut(store):
    turns = user(*(f"I like dish number {i}." for i in range(40)))
    assert len(RuleExtractor().propose(turns, []).facts) == 40  # the rules no longer stop at 32 by themselves
    report = store.ingest_session(turns, RuleExtractor(), session_id="long")
    assert report.status == "committed" and report.facts == 40 and not report.rejected
    assert report.parts == ("long.p1", "long.p2") and store.sessions() == ["long.p1", "long.p2"]
    assert sorted(f.quote for f in store.facts()) == sorted(t.content for t in turns)
    assert [f.turn for f in store.facts()] == list(range(40))  # turn indices run on across the parts
    assert store.ingest_session(turns, RuleExtractor(), session_id="long").status == "duplicate"
    assert len(store) == 40


def test_a_fact_keeps_its_turns_speaker_and_source_id(store):
    turns = [Turn("user", "I love tea.", "8 May 2023", "Caroline", "D1:1"), Turn("user", "I love jazz.")]
    store.ingest_session(turns, RuleExtractor())
    assert [(f.speaker, f.source, f.time) for f in store.facts()] == [
        ("Caroline", "D1:1", "8 May 2023"),
        (None, None, None),
    ]


def test_concept_edits_keep_a_tree(store):
    turns = user("I love tea. I love coffee. I like herbal infusions.")
    p = Proposal(
        facts=(
            FactProposal("n1", "Loves tea.", "preference", "global", "I love tea.", 0, ("drinks",)),
            FactProposal("n2", "Loves coffee.", "preference", "global", "I love coffee.", 0, ("drinks",)),
            FactProposal("n3", "Likes infusions.", "preference", "global", "I like herbal infusions.", 0, ("tisane",)),
        ),
        concepts=(
            ConceptEdit("CREATE", "food"),
            ConceptEdit("CREATE", "drinks", parent="food"),
            ConceptEdit("CREATE", "tisane"),
            ConceptEdit("CREATE", "ghost", parent="nowhere"),
            ConceptEdit("SPLIT", "drinks", parts=(("hot drinks", ("n1", "n2")),)),
            ConceptEdit("MERGE", "food", into="hot drinks"),  # food is above hot drinks: would be a cycle
            ConceptEdit("MERGE", "tisane", into="hot drinks"),
            ConceptEdit("EXPLODE", "food"),
        ),
    )
    report = store.ingest_session(turns, Scripted(p))
    assert report.concept_edits == 5
    assert {r.what: r.reason for r in report.rejected} == {
        "concept CREATE 'ghost'": "parent concept 'nowhere' does not exist",
        "concept MERGE 'food'": "'hot drinks' lies under 'food': the merge would make a cycle",
        "concept EXPLODE 'food'": "op 'EXPLODE' is not one of ['CREATE', 'MERGE', 'SPLIT']",
    }
    tree = {c.name: (c.parent, c.facts) for c in store.concepts()}
    # tisane was merged away (its fact m3 moved along); the SPLIT took m1 and m2 out of drinks.
    assert tree == {"food": (None, ()), "drinks": ("food", ()), "hot drinks": ("drinks", ("m1", "m2", "m3"))}
    # A retired name resolves to where it was merged.
    later = Proposal(
        facts=(FactProposal("n1", "Likes mint.", "preference", "global", "I like mint tea.", 0, ("tisane",)),)
    )
    store.ingest_session(user("I like mint tea."), Scripted(later))
    assert {c.name: c.facts for c in store.concepts()}["hot drinks"] == ("m1", "m2", "m3", "m4")


def test_duplicate_session_is_skipped(store):
    ex = RuleExtractor()
    assert store.ingest_session(user("I love tea."), ex).status == "committed"
    assert store.ingest_session(user("I love tea."), ex).status == "duplicate"  # same content, no id
    assert store.ingest_session(user("I love jazz."), ex, session_id="x").status == "committed"
    assert store.ingest_session(user("I love opera."), ex, session_id="x").status == "duplicate"
    assert len(store) == 2


def test_restated_preference_adds_nothing(store):
    ex = RuleExtractor()
    store.ingest_session(user("I love tea."), ex, session_id="a")
    report = store.ingest_session(user("I love tea."), ex, session_id="b")
    assert report.status == "committed" and report.fact_ids == () and report.facts == 0


def test_facts_and_relations_are_immutable(store):
    store.ingest_session(
        user("I love tea with milk and honey in the morning.",
             "These days I prefer green tea with milk and honey in the morning."), RuleExtractor()
    )  # fmt: skip
    assert store.relations()  # every table below has rows to refuse changing
    db = sqlite3.connect(store.path)
    for sql in (
        "UPDATE facts SET text = 'x'",
        "DELETE FROM facts",
        "UPDATE relations SET type = 'CONFLICTS_WITH'",
        "DELETE FROM relations",
        "UPDATE fact_vectors SET vec = x''",
    ):
        with pytest.raises(sqlite3.IntegrityError, match="immutable"):
            db.execute(sql)
    db.close()


def test_reopen_uses_the_recorded_embedder(tmp_path):
    path = tmp_path / "u.db"
    with MemoryStore(path, HashEmbedder(128)) as s:
        s.ingest_session(user("I love tea in the garden."), RuleExtractor(), session_id="s1")
    with MemoryStore(path) as s:  # no embedder given: the store's own
        assert s.embedder.name == "hash-128" and s.sessions() == ["s1"]
        assert retrieve(s, "tea garden").store_ids == ("m1",)
    with pytest.raises(StoreError, match="hash-128"):
        MemoryStore(path, HashEmbedder(64))


def test_rule_extractor_kinds_and_skips():
    assert fact_kind("I have a soft spot for Model Atlas when I think about it.") == "preference"
    assert fact_kind("I would like to book a table for two.") is None
    p = RuleExtractor().propose(
        [Turn("assistant", "I love tea."), Turn("user", "Right now I can't eat dairy. What about you?")], []
    )
    assert [(f.kind, f.scope, f.turn, f.quote) for f in p.facts] == [
        ("constraint", "situation", 1, "Right now I can't eat dairy.")
    ]


def test_split_scan_finds_the_same_nearest_facts(tmp_path, monkeypatch):
    """Above ``_SPLIT_SCAN_ROWS`` facts the scan runs in two halves at once; it must rank exactly as one pass."""
    import numpy as np

    from memstate.memory import search as search_module

    texts = [f"I like blue {w} number {i}." for i, w in enumerate(["tea", "cake", "kites", "maps"] * 30)]
    with MemoryStore(tmp_path / "split.db", HashEmbedder(64)) as s:
        s.ingest_session(user(*texts[:60]), RuleExtractor(), session_id="a")
        s.ingest_session(user(*texts[60:]), RuleExtractor(), session_id="b")
        query = s.embed_query("blue kites number 7")
        one_pass = s.nearest(query, 15)
        monkeypatch.setattr(search_module, "_SPLIT_SCAN_ROWS", 8)
        halves = s.nearest(query, 15)
        nums, matrix = s.index_view()
        assert len(nums) > 60 and halves == one_pass
        np.testing.assert_array_equal(search_module._scores(matrix, query), np.einsum("ij,j->i", matrix, query))
