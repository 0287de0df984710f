"""The LLM extractor against a real local OpenAI-compatible HTTP server (a thread) that answers valid JSON,
invalid JSON, schema-breaking JSON, invented quotes and errors, in a scripted order."""

from __future__ import annotations

import json

import pytest
from chat_server import ChatServer

from memstate.memory import HashEmbedder, LLMExtractor, MemoryStore, Turn, retrieve
from memstate.memory.extract import PROPOSAL_SCHEMA, ExtractorError


def scripted(replies: list) -> ChatServer:
    """A chat server answering with the next scripted reply: a dict (sent as the message content, JSON), a str (the
    content verbatim), or an int (that HTTP status); 500 once the script runs out."""
    queue = list(replies)

    def reply(_body):
        r = queue.pop(0) if queue else 500
        if isinstance(r, int):
            return r, "scripted"
        return 200, r if isinstance(r, str) else json.dumps(r)

    return ChatServer(reply)


TURNS = [
    Turn("user", "I used to love horror films, but these days I prefer gentle comedies.", "2024-03-01"),
    Turn("assistant", "Comedies it is."),
]
VALID = {
    "facts": [
        {
            "key": "n1",
            "text": "The user used to love horror films.",
            "kind": "preference",
            "scope": "domain",
            "turn": 0,
            "quote": "I used to love horror films",
            "concepts": ["films"],
        },
        {
            "key": "n2",
            "text": "The user now prefers gentle comedies.",
            "kind": "preference",
            "scope": "domain",
            "turn": 0,
            "quote": "these days I prefer gentle comedies",
            "concepts": ["films"],
        },
    ],
    "concepts": [{"op": "CREATE", "name": "films", "parent": None, "into": None, "parts": []}],
    "relations": [{"src": "n2", "type": "SUPERSEDES", "dst": "n1"}],
}


@pytest.fixture
def store(tmp_path):
    with MemoryStore(tmp_path / "llm.db", HashEmbedder(128)) as s:
        yield s


def test_valid_json_is_committed_with_its_relations(store):
    with scripted([VALID]) as server, LLMExtractor(server.url + "/v1", "extractor-model") as ex:
        report = store.ingest_session(TURNS, ex, session_id="s1")
    assert report.status == "committed" and report.rejected == ()
    assert report.edges == (("m2", "SUPERSEDES", "m1"),)
    assert [c.name for c in store.concepts()] == ["films"] and store.concepts()[0].facts == ("m1", "m2")
    facts = store.facts()
    assert [f.time for f in facts] == ["2024-03-01"] * 2 and facts[0].superseded_by == ("m2",)
    (request,) = server.requests
    assert request["path"] == "/v1/chat/completions" and request["model"] == "extractor-model"
    fmt = request["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"] == json.loads(json.dumps(PROPOSAL_SCHEMA))
    assert "[turn 0] user (2024-03-01): I used to love horror films" in request["messages"][1]["content"]
    ret = retrieve(store, "horror films", k=1)
    assert {f.role for f in ret.facts} == {"gold", "outdated"} and len(ret.relations) == 1


def test_context_reaches_the_prompt_and_existing_ids_are_accepted(store):
    later = {
        "facts": [
            {
                "key": "n1",
                "text": "The user is tired of comedies and wants thrillers.",
                "kind": "preference",
                "scope": "domain",
                "turn": 0,
                "quote": "I'm tired of comedies",
                "concepts": ["films"],
            }
        ],
        "concepts": [],
        "relations": [{"src": "n1", "type": "SUPERSEDES", "dst": "m2"}],
    }
    with scripted([VALID, later]) as server, LLMExtractor(server.url, "m") as ex:
        store.ingest_session(TURNS, ex)
        report = store.ingest_session([Turn("user", "I'm tired of comedies; thrillers now, please.")], ex)
    assert report.edges == (("m3", "SUPERSEDES", "m2"),)
    prompt = server.requests[1]["messages"][1]["content"]
    assert "[m2] (preference, domain, current; concepts: films) The user now prefers gentle comedies." in prompt
    assert "[m1] (preference, domain, superseded by m2; concepts: films)" in prompt


@pytest.mark.parametrize(
    "bad",
    [
        "{not json",
        json.dumps({"facts": [], "concepts": []}),  # relations missing
        json.dumps({**VALID, "facts": [{**VALID["facts"][0], "kind": "opinion"}]}),
        json.dumps({**VALID, "facts": [VALID["facts"][0]] * 33}),  # over the 32-fact limit
    ],
    ids=["not-json", "missing-field", "bad-kind", "too-many"],
)
def test_invalid_replies_are_retried_then_reject_the_session(store, bad):
    with scripted([bad, bad, bad]) as server, LLMExtractor(server.url, "m", retries=2, backoff=0) as ex:
        report = store.ingest_session(TURNS, ex)
    assert len(server.requests) == 3
    assert report.status == "rejected" and store.sessions() == [] and len(store) == 0
    reason = report.rejected[0].reason
    assert reason.startswith("extractor gave no valid proposal") and reason.count("invalid reply") == 3


def test_a_valid_retry_after_invalid_json_commits(store):
    replies = ["```json\n{oops", 503, "<think>ok</think>```json\n" + json.dumps(VALID) + "\n```"]
    with scripted(replies) as server, LLMExtractor(server.url, "m", retries=2, backoff=0) as ex:
        report = store.ingest_session(TURNS, ex)
    assert len(server.requests) == 3 and report.status == "committed" and report.facts == 2


def test_invented_quote_from_the_llm_rejects_the_session(store):
    invented = {**VALID, "facts": [VALID["facts"][0], {**VALID["facts"][1], "quote": "I adore comedies"}]}
    with scripted([invented]) as server, LLMExtractor(server.url, "m") as ex:
        report = store.ingest_session(TURNS, ex)
    assert report.status == "rejected" and "quote not found verbatim" in report.rejected[0].reason
    assert len(store) == 0 and store.sessions() == []


def test_server_errors_raise_after_bounded_retries(store):
    with scripted([500, 502, 429]) as server, LLMExtractor(server.url, "m", retries=2, backoff=0) as ex:
        with pytest.raises(ExtractorError, match="attempt 1: HTTP 500.*; attempt 2: HTTP 502.*; attempt 3: HTTP 429"):
            store.ingest_session(TURNS, ex)
    assert len(server.requests) == 3 and store.sessions() == []
    with scripted([400]) as server, LLMExtractor(server.url, "m", backoff=0) as ex:
        with pytest.raises(ExtractorError, match="HTTP 400"):  # a bad request is not retried
            ex.propose(TURNS, [])
    assert len(server.requests) == 1


def test_unreachable_server_raises(store):
    with scripted([]) as server:
        url = server.url
    with LLMExtractor(url, "m", retries=1, backoff=0, timeout=2) as ex, pytest.raises(ExtractorError, match="failed"):
        store.ingest_session(TURNS, ex)
