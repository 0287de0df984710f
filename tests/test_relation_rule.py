"""The one relation rule (``memory.relation_rule``): the PersonaMem builder the policy learns from and the extractors
that serve it draw the same edge for the same two statements, and the data manifest and every store record the
rule's version."""

from __future__ import annotations

import numpy as np
import pytest

from memstate.data_build import personamem
from memstate.memory import HashEmbedder, MemoryStore, Turn
from memstate.memory.extract import DEFAULT_EXTRACTOR, make_extractor
from memstate.memory.records import Proposal
from memstate.memory.relation_rule import RELATION_RULE_VERSION, Said, relate
from memstate.memory.rule_extractor import RuleExtractor
from memstate.memory.turn_extractor import TurnExtractor

OLD = "I love spicy food and hot chilli curries, Sichuan peppercorn dishes, the hotter the better."
NEW = "I no longer like spicy food: hot chilli curries and Sichuan peppercorn dishes upset my stomach."
OTHER = "My sister is getting married in Lagos next spring."
TURNS = [Turn("user", OLD), Turn("assistant", "Noted!"), Turn("user", OTHER), Turn("user", NEW)]


def _edges(proposal: Proposal) -> set[tuple[str, str, str]]:
    quote = {f.key: f.quote for f in proposal.facts}
    return {(quote[r.src], r.type, quote[r.dst]) for r in proposal.relations}


def _personamem_edges(vecs: np.ndarray | None = None) -> set[tuple[str, str, str]]:
    texts = [OLD, OTHER, NEW]
    ctx = personamem.Context(
        n_messages=4,
        indices=[0, 2, 3],
        texts=texts,
        kinds=[personamem.fact_kind(t) for t in texts],
        vectors=vecs if vecs is not None else np.eye(3, dtype=np.float32),
        said=[Said(str(i), "user", i, t) for i, t in zip([0, 2, 3], texts, strict=True)],
    )
    return {(texts[a], rel, texts[b]) for a, rel, b in personamem.relation_edges(ctx, [0, 1, 2])}


def test_builder_and_extractors_draw_the_same_edge_by_shared_words():
    expected = {(NEW, "SUPERSEDES", OLD)}
    assert _edges(TurnExtractor().propose(TURNS, [])) == expected
    assert _edges(RuleExtractor().propose(TURNS, [])) == expected
    # The builder's vectors all orthogonal: cosine says "not the same thing", so no edge; the rule decides by them.
    assert _personamem_edges() == set()


class _Fixed:
    """An embedder with set vectors: OLD and NEW 0.6 alike, OTHER unlike both (the extractors' sentences are the
    builder's turns here)."""

    name = "fixed"
    _vecs = {OLD: [1.0, 0.0, 0.0], NEW: [0.6, 0.8, 0.0], OTHER: [0.0, 0.0, 1.0], "Noted!": [0.0, 0.0, 1.0]}

    def encode(self, texts):
        return np.array([self._vecs[t] for t in texts], dtype=np.float32)


def test_builder_and_extractors_draw_the_same_edge_by_cosine():
    expected = {(NEW, "SUPERSEDES", OLD)}
    assert _personamem_edges(_Fixed().encode([OLD, OTHER, NEW])) == expected
    assert _edges(TurnExtractor(_Fixed()).propose(TURNS, [])) == expected
    assert _edges(RuleExtractor(_Fixed()).propose(TURNS, [])) == expected
    unlike = {OLD: [1.0, 0.0, 0.0], NEW: [0.5, 0.866, 0.0]}  # 0.5: the builder's old threshold drew it; not now
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_Fixed, "_vecs", _Fixed._vecs | unlike)
        assert _personamem_edges(_Fixed().encode([OLD, OTHER, NEW])) == set()
        assert _edges(TurnExtractor(_Fixed()).propose(TURNS, [])) == set()
        assert _edges(RuleExtractor(_Fixed()).propose(TURNS, [])) == set()


def test_no_change_cue_no_edge_however_alike():
    # The builder's old test (cosine >= 0.5 between preferences) drew this restatement; the rule does not.
    said = [Said("a", "user", 0, OLD), Said("b", "user", 1, OLD.replace("love", "adore"))]
    assert relate(said, np.ones((2, 4), dtype=np.float32) / 2) == []


def test_another_persons_statement_is_never_related():
    said = [Said("a", "Ana", 0, OLD), Said("b", "Ben", 1, NEW), Said("c", None, 2, NEW)]
    assert relate(said) == []


def test_store_records_the_rule_version(tmp_path):
    class Other:
        relation_rule = "llm:test"

        def propose(self, turns, context):
            return Proposal(())

    with MemoryStore(tmp_path / "s.db", HashEmbedder(64)) as store:
        assert store.meta_value("relation_rule") is None
        store.ingest_session(TURNS, make_extractor(), session_id="a")
        assert store.meta_value("relation_rule") == RELATION_RULE_VERSION
        store.ingest_session(TURNS[:1], make_extractor("rule"), session_id="b")
        store.ingest_session(TURNS[:1], Other(), session_id="c")
        assert store.meta_value("relation_rule") == f"{RELATION_RULE_VERSION},llm:test"


def test_one_default_extractor_for_ingest_and_evaluation():
    from memstate.memory.cli import ingest_parser

    assert DEFAULT_EXTRACTOR == "turns" and ingest_parser().get_default("extractor") == DEFAULT_EXTRACTOR
    assert type(make_extractor()) is TurnExtractor


@pytest.mark.parametrize("extractor", [TurnExtractor(), RuleExtractor()])
def test_extractors_name_the_rule(extractor):
    assert extractor.relation_rule == RELATION_RULE_VERSION
