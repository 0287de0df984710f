"""The retrieval backend registry: a toy backend defined here (its own module, nothing else edited) is used by
``retrieve``; unknown names and settings are configuration errors. ``tests/test_sweep.py`` runs ``eval memsyco`` and
the sweep with the same toy backend."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from memstate.errors import ConfigError
from memstate.memory import HashEmbedder, MemoryStore, RuleExtractor, Turn, retrieve
from memstate.memory.backends import Backend, Query, backend_names, get_backend, register, unregister


@dataclass(frozen=True)
class RecencySettings:
    newest_first: bool = True


def recency_search(query: Query) -> tuple[list[str], dict]:
    """The ``k`` most recently stored facts, whatever the query (a baseline no registry entry had to anticipate)."""
    ids = [f.id for f in query.store.facts()]
    ordered = ids[::-1] if query.settings is None or query.settings.newest_first else ids
    return ordered[: query.k], {"mode": "recency"}


RECENCY = Backend(
    name="recency",
    summary="the k most recently stored facts",
    search=recency_search,
    decisions=("none (stored order)",) * 2,
    relations=False,
    settings=RecencySettings,
)


@pytest.fixture
def recency():
    register(RECENCY)
    yield RECENCY
    unregister("recency")


@pytest.fixture
def store(tmp_path):
    with MemoryStore(tmp_path / "user.db", HashEmbedder(256)) as s:
        ex = RuleExtractor()
        for text in ("I love green tea in the morning.", "My cat is called Pepper.", "I moved to Leeds in May."):
            s.ingest_session([Turn("user", text)], ex)
        yield s


def test_builtins_are_registered_in_their_modules() -> None:
    assert backend_names()[:4] == ("evomem", "naive", "clag", "memsearch")
    assert get_backend("clag").search.__module__ == "memstate.memory.clag"
    assert get_backend("naive").relations is False and get_backend("evomem").relations is True


def test_a_registered_toy_backend_serves_retrieve(recency, store) -> None:
    assert "recency" in backend_names()
    got = retrieve(store, "green tea", k=2, backend="recency")
    newest = [f.id for f in store.facts()][::-1][:2]
    assert list(got.store_ids) == newest and got.relations == ()
    assert got.trace == {"backend": "recency", "mode": "recency"}
    oldest = retrieve(store, "green tea", k=1, backend="recency", settings=recency.make_settings({"newest_first": 0}))
    assert oldest.store_ids == (store.facts()[0].id,)


def test_unknown_backend_and_settings_are_config_errors(recency, store) -> None:
    with pytest.raises(
        ConfigError, match="unknown memory backend 'bm42'; known: evomem, naive, clag, memsearch, recency"
    ):
        retrieve(store, "tea", backend="bm42")
    with pytest.raises(ConfigError, match=r"unknown settings \['depth'\]"):
        recency.make_settings({"depth": 3})
    with pytest.raises(ConfigError, match="memory backend 'clag'"):
        get_backend("clag").make_settings({"centre": "median"})  # ClagConfig's own check, as a ConfigError
    with pytest.raises(ConfigError, match="takes no settings"):
        get_backend("naive").make_settings({"k": 3})


def test_a_name_cannot_be_taken_twice(recency) -> None:
    register(RECENCY)  # the same backend again (a module imported twice) is fine
    with pytest.raises(ValueError, match="already registered"):
        register(Backend("recency", "other", lambda q: ([], {}), ("none",) * 2))


def test_under_a_budget_each_backend_is_asked_for_its_own_seed_count(store) -> None:
    asked: list[int] = []

    def search(query: Query) -> tuple[list[str], dict]:
        asked.append(query.k)
        return recency_search(query)

    register(Backend("few_seeds", "recency, asked for few seeds", search, ("none",) * 2, budget_seeds=2))
    try:
        got = retrieve(store, "tea", k=1, backend="few_seeds", budget_tokens=1000)
        assert asked == [2] and len(got.store_ids) == 2  # the budget had room for all three facts
        retrieve(store, "tea", k=5, backend="few_seeds", budget_tokens=1000)
        retrieve(store, "tea", k=1, backend="few_seeds")  # no budget: k itself
        assert asked == [2, 5, 1]
    finally:
        unregister("few_seeds")
    assert get_backend("evomem").budget_seeds == 50 > get_backend("memsearch").budget_seeds
