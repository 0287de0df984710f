"""evomem's pseudo-relevance feedback (issue 57): a second hybrid search with the query's vector moved toward the
mean vector of its first results (Rocchio's rule), set through ``EvomemSettings``."""

from __future__ import annotations

import numpy as np
import pytest

from memstate.errors import ConfigError
from memstate.memory import MemoryStore, retrieve
from memstate.memory.backends import get_backend
from memstate.memory.embed import normalize
from memstate.memory.evomem import EvomemSettings, feedback_vector
from tests.test_memory_clag import AxisEmbedder, add

PLAIN = EvomemSettings(replies=0, feedback_facts=0)


@pytest.fixture
def store(tmp_path):
    with MemoryStore(tmp_path / "fb.db", AxisEmbedder()) as s:
        yield s


def test_the_feedback_vector_is_the_query_plus_the_weighted_mean_of_the_first_results(store):
    ids = add(store, "tea tea moon", "moon", "car")
    q = np.array(AxisEmbedder().encode(["tea"])[0]) * 3  # not unit: normalized first
    got = feedback_vector(store, q, ids[:2], 0.5)
    rows = store.vectors(ids[:2])
    np.testing.assert_allclose(rows, AxisEmbedder().encode(["tea tea moon", "moon"]), atol=1e-6)
    expected = normalize((q / np.linalg.norm(q) + 0.5 * rows.mean(axis=0)).reshape(1, -1))[0]
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert abs(np.linalg.norm(got) - 1) < 1e-5


def test_feedback_brings_up_what_the_best_match_is_about_and_off_leaves_the_order(store):
    # "tea" matches only the first fact; the moon fact shares its other topic. Without feedback the second place is a
    # tie among facts at cosine ~0 (the later stored first); with it, the moon fact is second.
    tea_moon, moon, car, jazz = add(store, "tea tea moon", "moon", "car", "jazz")
    plain = retrieve(store, "tea", k=2, depth=0, settings=PLAIN).store_ids
    fed = retrieve(store, "tea", k=2, depth=0, settings=EvomemSettings(replies=0, feedback_facts=1)).store_ids
    assert plain[0] == fed[0] == tea_moon
    assert plain[1] != moon and fed[1] == moon
    traced = retrieve(store, "tea", k=2, depth=0, settings=EvomemSettings(replies=0, feedback_facts=1)).trace
    assert traced["feedback"] == [tea_moon]
    assert "feedback" not in retrieve(store, "tea", k=2, depth=0, settings=PLAIN).trace


def test_the_default_search_runs_the_feedback_search_with_the_shipped_settings(store, monkeypatch):
    add(store, "tea tea moon", "moon", "car", "jazz", "green tea")
    seen: list[np.ndarray] = []
    scores = MemoryStore._dense_scores

    def recording(self, vector):
        seen.append(np.array(vector))
        return scores(self, vector)

    monkeypatch.setattr(MemoryStore, "_dense_scores", recording)
    got = retrieve(store, "tea", k=3, depth=0)
    first = got.trace["feedback"]
    assert len(first) == EvomemSettings().feedback_facts == 3 and len(seen) == 2
    expected = feedback_vector(store, store.embed_query("tea"), first, EvomemSettings().feedback_weight)
    np.testing.assert_allclose(seen[1], expected, atol=1e-6)
    seen.clear()
    retrieve(store, "tea", k=3, depth=0, settings=PLAIN)
    assert len(seen) == 1


@pytest.mark.parametrize(
    "options", [{"feedback_facts": -1}, {"replies": -2}, {"feedback_weight": -0.5}, {"pool": 0}, {"rrf": 5}]
)
def test_bad_evomem_settings_are_config_errors(options):
    with pytest.raises(ConfigError, match="evomem"):
        get_backend("evomem").make_settings(options)
    assert get_backend("evomem").make_settings({"feedback_facts": 0}).feedback_facts == 0
