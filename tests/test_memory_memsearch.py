"""MemSearch-o1 over the memory store: the contribution function (rel, BP with the τ weighting, C) and the greedy
path with its smoothness factor pinned on a hand-computed example; seeds; extractive fragment growth end to end with
relations among the returned facts; LLM fragment growth through a real local OpenAI-compatible server (verbatim
check, sub-queries, failures); the dense fallback."""

from __future__ import annotations

import hashlib
import json
import math
import re

import numpy as np
import pytest
from chat_server import ChatServer

from memstate.memory import (
    ChatJSON,
    MemoryStore,
    MemSearchConfig,
    RuleExtractor,
    Turn,
    contribution,
    greedy_path,
    retrieve,
)
from memstate.memory.embed import normalize
from memstate.memory.seeds import SeedExtractor, default_seed_extractor

# ---- scoring, by hand ------------------------------------------------------------------------------------------
#
# Question q = (1, 0), one sub-query s = (0, 1). Fragments (unit vectors), given in the order B, D, A, C:
#   A = (1, 0):        cos q 1,     cos s 0      → rel 1.0
#   B = (0.6, 0.8):    cos q 0.6,   cos s 0.8    → rel 0.8
#   C = (−0.6, 0.8):   cos q −0.6,  cos s 0.8    → rel 0.8
#   D = (0.28, −0.96): cos q 0.28,  cos s −0.96  → rel 0.28 (below τ = 0.3: weight 0)
# Weights w = max(rel − 0.3, 0): A 0.7, B 0.5, C 0.5, D 0.
# Cosines: AB 0.6, AC −0.6, AD 0.28, BC 0.28, BD −0.6, CD −0.936.
#   BP_A = (0.6·0.5 − 0.6·0.5 + 0.28·0) / (0.5 + 0.5 + 0) = 0
#   BP_B = (0.6·0.7 + 0.28·0.5 − 0.6·0) / (0.7 + 0.5 + 0) = 0.56 / 1.2
#   BP_C = (−0.6·0.7 + 0.28·0.5 − 0.936·0) / 1.2 = −0.28 / 1.2
#   BP_D = (0.28·0.7 − 0.6·0.5 − 0.936·0.5) / (0.7 + 0.5 + 0.5) = −0.572 / 1.7   (D's own zero weight is not used)
# C = 0.6·rel + 0.4·BP: A 0.6, B 0.48 + 0.56/3 = 2/3, C 0.48 − 0.28/3, D 0.168 − 0.2288/1.7.
# Path from q (λ = 1): step 1 scores C·exp(−(1 − cos(q, ·))): A 0.6·e⁰ = 0.6, B (2/3)·e^−0.4 = 0.4469,
# C 0.3867·e^−1.6 = 0.0781, D 0.0334·e^−0.72 = 0.0163 → A (although B has the larger C). From A (= q): B.
# From B: C 0.3867·e^−0.72 = 0.1882, D 0.0334·e^−1.6 = 0.0067 → C, then D. With λ = 0 the order is by C: B, A, C, D.

A, B, C, D = (1.0, 0.0), (0.6, 0.8), (-0.6, 0.8), (0.28, -0.96)
FRAGMENTS = np.array([B, D, A, C])  # indices: B 0, D 1, A 2, C 3
QUERIES = np.array([[1.0, 0.0], [0.0, 1.0]])


def test_contribution_on_the_hand_computed_example():
    s = contribution(FRAGMENTS, QUERIES, alpha=0.6, beta=0.4, tau=0.3)
    assert s.rel == pytest.approx([0.8, 0.28, 1.0, 0.8])
    assert s.bp == pytest.approx([0.56 / 1.2, -0.572 / 1.7, 0.0, -0.28 / 1.2])
    assert s.c == pytest.approx([2 / 3, 0.168 - 0.4 * 0.572 / 1.7, 0.6, 0.48 - 0.4 * 0.28 / 1.2])
    assert contribution(FRAGMENTS, QUERIES).c == pytest.approx(s.c)  # the defaults are α 0.6, β 0.4, τ 0.3


def test_tau_weights_only_fragments_relevant_enough():
    s = contribution(FRAGMENTS, QUERIES, tau=0.9)  # only A (rel 1.0) has weight: BP_i = cos(i, A), BP_A = 0
    assert s.bp == pytest.approx([0.6, 0.28, 0.0, -0.6])
    none = contribution(FRAGMENTS, QUERIES, tau=1.0)  # no weight anywhere: BP 0, C = α·rel
    assert none.bp == pytest.approx([0, 0, 0, 0]) and none.c == pytest.approx(0.6 * none.rel)


def test_greedy_path_with_the_smoothness_factor():
    c = contribution(FRAGMENTS, QUERIES).c
    q = QUERIES[0]
    assert greedy_path(FRAGMENTS, c, q, k=15, lam=1.0) == [2, 0, 3, 1]  # A, B, C, D
    assert greedy_path(FRAGMENTS, c, q, k=2, lam=1.0) == [2, 0]  # at most K fragments
    assert greedy_path(FRAGMENTS, c, q, lam=0.0) == [0, 2, 3, 1]  # no smoothness: by C alone (B first)
    first = [float(c[i]) * math.exp(-(1 - float(q @ FRAGMENTS[i]))) for i in range(4)]
    assert first == pytest.approx([(2 / 3) * math.exp(-0.4), float(c[1]) * math.exp(-0.72), 0.6,
                                   float(c[3]) * math.exp(-1.6)])  # fmt: skip


# ---- seeds --------------------------------------------------------------------------------------------------------


def test_seeds_are_noun_chunks_verb_lemmas_and_dates():
    extractor = default_seed_extractor()
    assert extractor.name in ("spacy-blank-en+lookups+rules", "en_core_web_sm")  # labelled; no model downloaded
    seeds = [(s.text, s.kind) for s in extractor("What did I decide about the green tea I bought last Monday?")]
    assert seeds == [("green tea", "noun"), ("decide", "verb"), ("buy", "verb"), ("last Monday", "date")]
    seeds = {(s.text, s.kind) for s in extractor("Where did my sister move in 2019, and does she still work?")}
    assert {("sister", "noun"), ("move", "verb"), ("work", "verb"), ("2019", "date")} <= seeds
    assert SeedExtractor().name == extractor.name


# ---- end to end over a store ----------------------------------------------------------------------------------

TOPICS = {"tea": 0, "car": 1, "volvo": 1, "moon": 2, "sister": 3, "bergen": 3}


class AxisEmbedder:
    """Topic words are axes; other words add a small hashed component (see tests/test_memory_clag.py)."""

    name = "axis-test-16"

    def encode(self, texts):
        out = np.zeros((len(texts), 16), dtype=np.float32)
        for i, text in enumerate(texts):
            for w in re.findall(r"[a-z]+", text.lower()):
                if w in TOPICS:
                    out[i, TOPICS[w]] += 1.0
                else:
                    out[i, 4 + int(hashlib.md5(w.encode()).hexdigest(), 16) % 12] += 0.15
            if not out[i].any():
                out[i, 15] = 1.0
        return normalize(out)


@pytest.fixture
def store(tmp_path):
    with MemoryStore(tmp_path / "ms.db", AxisEmbedder()) as s:
        ex = RuleExtractor(s.embedder)  # the two teas share one topic word: the same thing by cosine (the tea axis)
        for text in ("I love green tea.", "My car is a red Volvo.", "These days I prefer black tea.",
                     "I saw the moon last night.", "My sister lives in Bergen."):  # fmt: skip
            s.ingest_session([Turn("user", text)], ex)
        assert ("m3", "SUPERSEDES", "m1") in s.relations()
        yield s


def test_extractive_growth_scoring_and_path_end_to_end(store):
    got = retrieve(store, "Which tea do I like now?", k=2, backend="memsearch")
    t = got.trace
    assert t["extractor"] == "extractive" and t["fallback"] is None and t["seed_pipeline"].startswith(("spacy", "en"))
    assert ["tea", "noun"] in t["seeds"] and ["like", "verb"] in t["seeds"]
    assert t["sub_queries"][0] == "Which tea do I like now?" and t["sub_queries"][1] == "like"  # uncovered seeds
    grown = {(f["seed"], f["text"]) for f in t["fragments"]}
    assert grown == {("tea", "I love green tea."), ("tea", "These days I prefer black tea.")}
    assert set(got.store_ids) == {"m1", "m3"} and [f.text for f in got.facts] == [
        t["fragments"][i]["text"] for i in t["path"]
    ]
    assert [(r.src, r.type, r.dst) for r in got.relations] == [
        (f"F{got.store_ids.index('m3') + 1}", "SUPERSEDES", f"F{got.store_ids.index('m1') + 1}")
    ]  # the relational state among the returned facts, as for the other backends
    # the trace's scores are the contribution function over the fragments' vectors and the queries
    vecs = AxisEmbedder().encode([f["text"] for f in t["fragments"]])
    queries = AxisEmbedder().encode(t["sub_queries"])
    s = contribution(vecs, queries)
    assert [f["c"] for f in t["fragments"]] == pytest.approx(s.c.tolist(), abs=1e-4)
    assert t["path"] == greedy_path(vecs, s.c, queries[0], k=15, lam=1.0)


def test_no_fragment_falls_back_to_the_dense_hits(store):
    got = retrieve(store, "Anything about quantum physics?", k=2, backend="memsearch")
    assert got.trace["fallback"] == "dense" and got.trace["path"] == []
    assert got.store_ids == retrieve(store, "Anything about quantum physics?", k=2, backend="naive").store_ids


def _llm(calls: list[dict]):
    def reply(body):
        name = body["response_format"]["json_schema"]["name"]
        calls.append({"name": name, "user": body["messages"][-1]["content"]})
        if name == "memsearch_grow":
            return 200, json.dumps({"fragments": [
                {"seed": "tea", "memory": "m1", "content": "prefer black tea"},  # verbatim, but from m3: found there
                {"seed": "tea", "memory": "m1", "content": "The user adores tea."},  # paraphrase: dropped
            ]})  # fmt: skip
        if name == "memsearch_query":
            return 200, json.dumps({"query": ""})  # nothing missing: stop after round 1
        return 400, "unexpected"

    return reply


def test_llm_grows_verbatim_fragments_only_and_stops_when_nothing_is_missing(store):
    calls: list[dict] = []
    with ChatServer(_llm(calls)) as server:
        llm = ChatJSON(server.url, "extractor", retries=0, backoff=0.0)
        got = retrieve(store, "Which tea do I like now?", k=2, backend="memsearch", llm=llm)
    t = got.trace
    assert t["extractor"] == "llm" and t["rejected_fragments"] == 1 and t["sub_queries"] == ["Which tea do I like now?"]
    assert [(f["text"], f["source"], f["via"]) for f in t["fragments"]] == [("prefer black tea", "m3", "llm")]
    assert got.store_ids == ("m3",)
    assert [c["name"] for c in calls] == ["memsearch_grow", "memsearch_query"]
    assert "[m1] I love green tea." in calls[0]["user"] and "tea" in calls[0]["user"]


def test_llm_failures_fall_back_to_extraction_and_are_labelled(store):
    with ChatServer(lambda body: (503, "down")) as server:
        llm = ChatJSON(server.url, "extractor", retries=0, backoff=0.0)
        got = retrieve(store, "Which tea do I like now?", k=2, backend="memsearch", llm=llm,
                       settings=MemSearchConfig(rounds=2))  # fmt: skip
    t = got.trace
    assert t["llm_failures"] == 3  # round 1 growth, the sub-query, round 2 growth
    assert {f["via"] for f in t["fragments"]} == {"extractive (llm failed)"} and set(got.store_ids) == {"m1", "m3"}
