"""CLAG over the memory store: k-means bootstrap, routing (new cluster below the threshold, nearest centre, an LLM's
choice through a real local OpenAI-compatible server), the split of an oversized cluster, two-stage retrieval with
its global fallback, state persisted in the store's SQLite file (schema upgrade from version 1)."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from dataclasses import replace

import numpy as np
import pytest
from chat_server import ChatServer

from memstate.memory import ChatJSON, ClagConfig, ClagMemory, MemoryStore, Turn, clag_memory, retrieve
from memstate.memory.embed import normalize
from memstate.memory.records import FactProposal, Proposal
from memstate.memory.store import SCHEMA_VERSION, StoreError

TOPICS = {"tea": 0, "car": 1, "volvo": 1, "moon": 2, "jazz": 3}


class AxisEmbedder:
    """Topic words are axes (tea, car, moon, jazz); every other word adds a small hashed component, so texts of one
    topic are near each other and far from the others — geometry the tests can reason about."""

    name = "axis-test-16"
    other = 0.15  # weight of a non-topic word

    def encode(self, texts):
        out = np.zeros((len(texts), 16), dtype=np.float32)
        for i, text in enumerate(texts):
            for w in re.findall(r"[a-z]+", text.lower()):
                w = w[:-1] if w.endswith("s") and w[:-1] in TOPICS else w
                if w in TOPICS:
                    out[i, TOPICS[w]] += 1.0
                else:
                    out[i, 4 + int(hashlib.md5(w.encode()).hexdigest(), 16) % 12] += self.other
            if not out[i].any():
                out[i, 15] = 1.0
        return normalize(out)


class Verbatim:
    """Each user turn becomes one fact, verbatim (the tests control exactly what is stored)."""

    def propose(self, turns, context):
        return Proposal(
            facts=tuple(
                FactProposal(f"n{i + 1}", t.content, "fact", "global", t.content, i)
                for i, t in enumerate(turns)
                if t.role == "user"
            )
        )


TEA = ["I drink green tea.", "Tea with honey is lovely.", "Black tea in the morning.", "Mint tea after dinner."]
CAR = ["My car is a Volvo.", "The car needs new tyres."]


def add(store: MemoryStore, *texts: str) -> list[str]:
    return [store.ingest_session([Turn("user", t)], Verbatim()).fact_ids[0] for t in texts]


@pytest.fixture
def store(tmp_path):
    with MemoryStore(tmp_path / "clag.db", AxisEmbedder()) as s:
        yield s


CFG = ClagConfig(bootstrap_min=4, bootstrap_clusters=2, new_cluster_threshold=0.5, select_threshold=0.5,
                 split_size=50, consolidation_period=100)  # fmt: skip


def test_kmeans_bootstrap_then_state_persists(store, tmp_path):
    tea1, car1, tea2 = add(store, TEA[0], CAR[0], TEA[1])
    mem = ClagMemory(store, CFG)
    report = mem.sync()
    assert not report.bootstrapped and mem.clusters() == []  # fewer than bootstrap_min facts: no clusters yet
    got = retrieve(store, "What tea do I drink?", k=2, backend="clag", settings=CFG)
    assert got.trace["mode"] == "global (not bootstrapped)" and len(got.facts) == 2
    (car2,) = add(store, CAR[1])
    report = clag_memory(store, CFG).sync()
    assert report.bootstrapped and report.new_clusters == 2
    clusters = clag_memory(store, CFG).clusters()
    assert sorted(sorted(c.members) for c in clusters) == sorted([sorted([tea1, tea2]), sorted([car1, car2])])
    assert all(c.origin == "kmeans" and c.profile_source == "keywords" and c.parent is None for c in clusters)
    by_topic = {("tea" if tea1 in c.members else "car"): c for c in clusters}
    assert "tea" in by_topic["tea"].tags and "car" in by_topic["car"].tags
    assert {clag_memory(store, CFG).router_of(f) for f in (tea1, car1, tea2, car2)} == {"kmeans"}
    with MemoryStore(tmp_path / "clag.db", AxisEmbedder()) as again:  # another connection reads the same state
        assert ClagMemory(again, CFG).clusters() == clusters
        rows = again.db.execute("SELECT COUNT(*) FROM clag_members").fetchone()[0]
        assert rows == 4 and again.meta_value("clag_last_fact") == car2[1:]


def test_new_cluster_below_the_threshold_and_nearest_centre_otherwise(store):
    add(store, TEA[0], CAR[0], TEA[1], CAR[1])
    mem = clag_memory(store, CFG)
    mem.sync()
    tea_cluster = mem.cluster_of("m1")
    moon, tea3 = add(store, "I watched the moon rise.", TEA[2])
    report = mem.sync()
    assert report.routed == 2 and report.new_clusters == 1
    assert mem.router_of(moon) == "threshold" and mem.cluster_of(moon) not in (tea_cluster, mem.cluster_of("m2"))
    new = next(c for c in mem.clusters() if c.id == mem.cluster_of(moon))
    assert new.origin == "new" and new.members == (moon,) and "moon" in new.tags
    assert mem.router_of(tea3) == "nearest-centroid" and mem.cluster_of(tea3) == tea_cluster


def test_an_oversized_cluster_is_split_in_two(store, tmp_path):
    cfg = ClagConfig(bootstrap_min=2, bootstrap_clusters=1, new_cluster_threshold=0.3, split_size=3,
                     consolidation_period=100)  # fmt: skip
    facts = add(store, *TEA)
    mem = clag_memory(store, cfg)
    report = mem.sync()
    assert report.bootstrapped and report.splits == 0 and [c.size for c in mem.clusters()] == [4]
    assert mem.consolidate() == 1  # the periodic consolidation, run now: 4 > split_size
    clusters = mem.clusters()
    assert all(c.size <= 3 for c in clusters) and sorted(m for c in clusters for m in c.members) == sorted(facts)
    assert all(c.origin == "split" and c.parent == "c1" for c in clusters) and len(clusters) == 2
    assert {mem.router_of(f) for f in facts} == {"split"}
    db = sqlite3.connect(tmp_path / "clag.db")
    assert db.execute("SELECT retired, origin FROM clag_clusters WHERE num = 1").fetchone() == (1, "kmeans")
    assert db.execute("SELECT COUNT(*) FROM clag_clusters WHERE parent = 1 AND retired = 0").fetchone() == (2,)
    with MemoryStore(tmp_path / "periodic.db", AxisEmbedder()) as other:  # every consolidation_period routed facts
        add(other, *TEA, "Oolong tea is smooth.")
        periodic = ClagMemory(other, replace(cfg, consolidation_period=1))
        report = periodic.sync()
        assert report.consolidations == 3 and report.splits >= 1 and all(c.size <= 3 for c in periodic.clusters())


def test_two_stage_retrieval_and_the_global_fallback(store):
    tea1, car1, tea2, car2 = add(store, TEA[0], CAR[0], TEA[1], CAR[1])
    add(store, "I heard jazz in a bar.")  # opens its own cluster (threshold)
    got = retrieve(store, "Which car do I drive?", k=5, backend="clag", settings=CFG)
    mem = clag_memory(store, CFG)
    assert got.trace["mode"] == "cluster" and got.trace["selector"] == "similarity"
    assert got.trace["clusters"] == [mem.cluster_of(car1)] and got.trace["search_space"] == 2
    assert set(got.store_ids) == {car1, car2}  # stage 2 searched only inside the car cluster
    assert list(got.trace["candidates"])[0] == mem.cluster_of(car1)
    fallback = retrieve(store, "Tell me about the weather.", k=2, backend="clag", settings=CFG)
    assert fallback.trace["mode"] == "global-fallback" and fallback.trace["clusters"] == []
    naive = retrieve(store, "Tell me about the weather.", k=2, backend="naive")
    assert fallback.store_ids == naive.store_ids


def test_two_processes_do_not_route_twice(tmp_path):
    with MemoryStore(tmp_path / "two.db", AxisEmbedder()) as a, MemoryStore(tmp_path / "two.db", AxisEmbedder()) as b:
        add(a, TEA[0], CAR[0], TEA[1], CAR[1])
        mem_a, mem_b = ClagMemory(a, CFG), ClagMemory(b, CFG)  # both loaded before anything was routed
        mem_a.sync()
        add(a, TEA[2])
        assert mem_b.sync().routed == 1  # b saw a's commit, reloaded, routed only the new fact
        assert ClagMemory(a, CFG).clusters() == mem_b.clusters()
        assert b.db.execute("SELECT COUNT(*) FROM clag_members").fetchone()[0] == 5


def _llm_server(calls: list[str]):
    def reply(body):
        name = body["response_format"]["json_schema"]["name"]
        schema = body["response_format"]["json_schema"]["schema"]
        user = body["messages"][-1]["content"]
        calls.append(name)
        if name == "clag_profile":
            if "car" in user.lower():
                return 200, json.dumps({"summary": "The user's car.", "tags": ["car", "Volvo"]})
            return 200, json.dumps({"summary": "Tea the user drinks.", "tags": ["Tea", "drinks", "tea", "hot drinks"]})
        if name == "clag_route":
            memory = user.split("\n")[0]
            ids = [i for i in schema["properties"]["choice"]["enum"] if i != "new"]
            if "honey" in memory:
                return 200, json.dumps({"choice": "new"})
            if "broken" in memory:
                return 200, "not json at all"
            return 200, json.dumps({"choice": ids[-1]})  # deliberately not the nearest cluster
        if name == "clag_select":
            return 200, json.dumps({"clusters": schema["properties"]["clusters"]["items"]["enum"][-1:]})
        return 400, "unexpected"

    return reply


def test_llm_routes_writes_profiles_and_selects_clusters(store):
    calls: list[str] = []
    with ChatServer(_llm_server(calls)) as server:
        llm = ChatJSON(server.url, "router", retries=0, backoff=0.0)
        tea1, car1, tea2, car2 = add(store, TEA[0], CAR[0], TEA[2], CAR[1])
        mem = clag_memory(store, CFG, llm)
        mem.sync()
        assert {c.profile_source for c in mem.clusters()} == {"llm"}
        assert {c.tags for c in mem.clusters()} == {("tea", "drinks", "hot"), ("car", "volvo")}
        car3, honey, broken = add(store, "My Volvo car is blue.", TEA[1], "My car is broken tea.")
        mem.sync()
        nearest_car = mem.cluster_of(car1)
        assert mem.router_of(car3) == "llm" and mem.cluster_of(car3) != nearest_car  # the LLM's choice stands
        assert mem.router_of(honey) == "llm-new" and mem.clusters()[-1].members == (honey,)
        assert mem.router_of(broken) == "nearest-centroid (llm failed)"
        got = retrieve(store, "Which car do I drive?", k=3, backend="clag", settings=CFG, llm=llm)
        assert got.trace["selector"] == "llm" and got.trace["router"] == "llm" and got.trace["mode"] == "cluster"
        assert got.trace["clusters"] == [list(got.trace["candidates"])[-1]]
    assert {"clag_profile", "clag_route", "clag_select"} <= set(calls)
    assert server.requests[0]["temperature"] == 0.0 and server.requests[0]["model"] == "router"


def test_a_version_1_store_is_upgraded_in_place(tmp_path):
    path = tmp_path / "old.db"
    with MemoryStore(path, AxisEmbedder()) as s:
        add(s, TEA[0])
    db = sqlite3.connect(path)
    db.executescript(
        "DROP TRIGGER facts_fts_insert; DROP TABLE facts_fts; DROP TABLE clag_members; DROP TABLE clag_clusters; "
        "ALTER TABLE facts DROP COLUMN speaker; ALTER TABLE facts DROP COLUMN source; "
        "UPDATE schema_version SET version = 1;"
    )
    db.close()
    with MemoryStore(path, AxisEmbedder()) as s:  # opening upgrades: additive tables and columns, facts untouched
        assert s.db.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION == 4
        assert [(f.text, f.speaker, f.source) for f in s.facts()] == [(TEA[0], None, None)]
        assert [ref for ref, _ in s.lexical(TEA[0], 5)] == ["m1"]  # the lexical index is built from the old facts
        assert ClagMemory(s, ClagConfig(bootstrap_min=1)).sync().bootstrapped
    db = sqlite3.connect(path)
    db.execute("UPDATE schema_version SET version = 5")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="schema version 5"):
        MemoryStore(path, AxisEmbedder())
