"""Hybrid retrieval: the store's own FTS5 index finds what the embedder cannot (a rare word, a number), fused with the
dense ranking by reciprocal rank in evomem, CLAG and MemSearch-o1; naive stays dense only. Speakers' names are left
out of the query's vector and matched lexically."""

from __future__ import annotations

import numpy as np
import pytest

from memstate.memory import MemoryStore, Turn, retrieve
from memstate.memory.clag import ClagConfig, clag_memory
from memstate.memory.embed import normalize
from memstate.memory.records import FactProposal, Proposal
from memstate.memory.search import match_query
from tests.test_memory_clag import AxisEmbedder, Verbatim

TEA = [f"Tea note {i}: green tea with honey." for i in range(12)]
PASSPORT = "The tea shop asked for my passport number, 4471."


class TopicOnly(AxisEmbedder):
    """Topic words only: what a small embedder does to a rare word or a number (nothing)."""

    name = "topic-only-16"
    other = 0.0


class Recorder(AxisEmbedder):
    """AxisEmbedder that remembers what it was asked to encode."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def encode(self, texts):
        self.seen += list(texts)
        return super().encode(texts)


class Labelled:
    """Each turn one fact ``"<speaker>: <words>"`` (as the turn extractor labels them), speaker kept."""

    def propose(self, turns, context):
        facts = tuple(
            FactProposal(f"n{i + 1}", f"{t.speaker}: {t.content}", "fact", "global", t.content, i)
            for i, t in enumerate(turns)
        )
        return Proposal(facts)


@pytest.fixture
def store(tmp_path):
    with MemoryStore(tmp_path / "hybrid.db", TopicOnly()) as s:
        for text in [PASSPORT, *TEA]:  # first: ties in dense search go to the later facts
            s.ingest_session([Turn("user", text)], Verbatim())
        yield s


def test_lexical_search_finds_the_rare_word_dense_search_ranks_with_the_rest(store):
    passport = "m1"
    query = "What is my passport number?"
    assert [ref for ref, _ in store.lexical(query, 3)] == [passport]  # only it holds "passport" / "number"
    dense = [ref for ref, _ in store.nearest(store.embed_query(query), 5)]
    assert passport not in dense  # no topic word in the query: every fact ties, the later ones first
    assert retrieve(store, query, k=5, backend="naive").store_ids == tuple(dense)
    assert retrieve(store, query, k=5, backend="evomem").store_ids[0] == passport
    assert store.hybrid(query, store.embed_query(query), 5)[0] == passport


def test_a_query_of_stop_words_only_is_dense_search(store):
    assert match_query("What was it?") is None and store.lexical("What was it?", 5) == []
    vec = store.embed_query("What was it?")
    assert store.hybrid("What was it?", vec, 4) == [ref for ref, _ in store.nearest(vec, 4)]


def test_memsearch_rounds_search_with_the_hybrid(store):
    got = retrieve(store, "my passport number 4471", k=3, backend="memsearch")
    assert "m1" in got.store_ids


def test_clag_fuses_its_clusters_with_the_store_wide_lexical_ranking(tmp_path):
    cfg = ClagConfig(bootstrap_min=4, bootstrap_clusters=2, new_cluster_threshold=0.5, select_threshold=0.5,
                     split_size=50, consolidation_period=100)  # fmt: skip
    with MemoryStore(tmp_path / "clag.db", AxisEmbedder()) as s:
        for text in ["I drink green tea.", "Tea with honey.", "My car is a Volvo.", "The car needs tyres.",
                     "The car dealer sold it for 9000 kroner."]:  # fmt: skip
            s.ingest_session([Turn("user", text)], Verbatim())
        mem = clag_memory(s, cfg)
        mem.sync()
        got = retrieve(s, "Which tea for 9000 kroner?", k=3, backend="clag", settings=cfg)
        assert got.trace["mode"] == "cluster" and got.trace["clusters"] == [mem.cluster_of("m1")]  # the tea cluster
        assert "m5" not in mem.clusters()[[c.id for c in mem.clusters()].index(mem.cluster_of("m1"))].members
        assert "m5" in got.store_ids  # from another cluster, by its rare words


def test_the_query_vector_leaves_the_speakers_names_to_the_lexical_index(tmp_path):
    embedder = Recorder()
    with MemoryStore(tmp_path / "names.db", embedder) as s:
        s.ingest_session(
            [
                Turn("user", "Wow, Caroline! Tea again?", speaker="Melanie"),
                Turn("user", "I researched tea farms in Kenya.", speaker="Caroline"),
            ],  # fmt: skip
            Labelled(),
        )
        assert s.speakers() == ["Caroline", "Melanie"]
        vec = s.embed_query("What did Caroline's friend research?")
        assert embedder.seen[-1] == "What did friend research?"
        assert np.allclose(vec, normalize(embedder.encode(["What did friend research?"]))[0])
        assert s.lexical("What did Caroline research?", 1)[0][0] == "m2"  # name and stem, lexically
