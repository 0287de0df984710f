"""The reasoning-state API in front of a policy: shapes, limits, auth and every failure of the policy.

The policy is an ``httpx.MockTransport`` scripted per test (what vLLM's chat endpoint would answer), except for
"policy down", which points the API at a port nobody listens on. The real-vLLM path is ``test_serve_vllm.py``.
Auth is off (``auth: none``) unless a test is about it; hostile clients and auth: ``test_serve_hostile.py``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import httpx
import pytest
from fastapi.testclient import TestClient

from memstate.prompts import PROMPT_VERSION, policy_messages
from memstate.schema import FACT_KINDS, Fact, Instance, Relation
from memstate.serve.api import ApiConfig, create_app
from memstate.serve.policy import free_port

GOOD = "- Prefer F2 over F1: F2 supersedes it.\n- Answer from the current memory only."
BAD = "Sure! You live in Oslo."

INSTANCE = Instance(
    id="q1",
    source="personamem",
    task="preference_update",
    perspective="none",
    question="Which city should I search flats in?",
    options=("Bergen", "Oslo", "Tromsø"),
    answer="B",
    answer_kind="choice",
    labels=(),
    facts=(
        Fact("F1", "I live in Bergen.", "fact", "global", turn=1, time="2023-01-02"),
        Fact("F2", "I moved to Oslo last month.", "fact", "global", turn=9, time="2024-05-01"),
        Fact("F3", "I like rainy weather.", "preference", "domain"),
    ),
    relations=(Relation("F2", "SUPERSEDES", "F1"),),
)


def payload(instance: Instance = INSTANCE) -> dict:
    """The request a memory pipeline sends for ``instance`` (role is analysis-only and never sent)."""
    facts = [{k: v for k, v in asdict(f).items() if k != "role"} for f in instance.facts]
    return {
        "question": instance.question,
        "facts": facts,
        "relations": [asdict(r) for r in instance.relations],
        "options": list(instance.candidates),
    }


class ScriptedPolicy:
    """Answers like vLLM's OpenAI server; ``replies`` are consumed in order by chat calls (last one repeats)."""

    def __init__(self, *replies: str | Exception | httpx.Response):
        self.replies = list(replies) or [GOOD]
        self.chats: list[dict] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "policy-7", "object": "model"}]})
        if request.url.path == "/health":
            return httpx.Response(200)
        assert request.url.path == "/v1/chat/completions", request.url.path
        self.chats.append(json.loads(request.content))
        reply = self.replies[min(len(self.chats) - 1, len(self.replies) - 1)]
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, httpx.Response):
            return reply
        return httpx.Response(200, json={"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]})


def client(policy: ScriptedPolicy | None, **overrides) -> TestClient:
    config = ApiConfig(**{"auth": "none"} | overrides)
    app = create_app(config, policy_transport=httpx.MockTransport(policy) if policy else None)
    return TestClient(app)


def post(api: TestClient, body, **kwargs) -> httpx.Response:
    return api.post("/v1/reasoning-state", json=body, **kwargs)


def test_valid_request_gets_the_training_prompt_and_a_parsed_state():
    policy = ScriptedPolicy(GOOD)
    with client(policy) as api:
        reply = post(api, payload())
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["rules"] == ["Prefer F2 over F1: F2 supersedes it.", "Answer from the current memory only."]
    assert body["format_ok"] and body["format_error"] is None and body["attempts"] == 1
    assert body["model"] == "policy-7" and body["prompt_version"] == PROMPT_VERSION
    assert body["text"] == GOOD and body["facts_truncated"] == 0 and body["latency_ms"] > 0
    assert body["names_option"] is None
    (chat,) = policy.chats
    assert chat["messages"] == policy_messages(INSTANCE)  # byte for byte the prompt the policy was trained on
    assert chat["model"] == "policy-7" and chat["temperature"] == 0.3 and chat["max_tokens"] == 512


def test_a_state_naming_an_option_is_reported_by_the_training_leak_gate():
    policy = ScriptedPolicy("- Prefer F2 over F1.\n- Say Oslo.")
    with client(policy) as api:
        body = post(api, payload()).json()
        metrics = api.get("/metrics").text
    assert body["format_ok"] and body["names_option"] == "names an option's text: 'Oslo'"
    assert "memstate_api_states_naming_an_option_total 1.0" in metrics


def test_a_reply_failing_the_format_is_retried_once():
    policy = ScriptedPolicy(BAD, GOOD)
    with client(policy) as api:
        body = post(api, payload()).json()
    assert body["format_ok"] and body["attempts"] == 2 and len(policy.chats) == 2


def test_a_reply_failing_the_format_twice_is_answered_without_rules():
    policy = ScriptedPolicy(BAD)
    with client(policy) as api:
        reply = post(api, payload())
        metrics = api.get("/metrics").text
    assert reply.status_code == 200
    body = reply.json()
    assert not body["format_ok"] and body["rules"] == [] and body["attempts"] == 2 and body["text"] == BAD
    assert body["format_error"] == "line 1 does not start with '- '"
    assert "memstate_api_format_failures_total 2.0" in metrics
    assert "memstate_api_states_unusable_total 1.0" in metrics
    assert 'memstate_api_requests_total{path="/v1/reasoning-state",status="200"} 1.0' in metrics


def test_a_reply_cut_off_at_max_tokens_is_no_state_and_is_asked_for_again():
    # vLLM says finish_reason "length" when it stopped at max_tokens: the text may look like a state, but its last
    # rule is unfinished, and training scores such a completion as a format failure too.
    cut = httpx.Response(200, json={"choices": [{"index": 0, "finish_reason": "length",
                                                 "message": {"role": "assistant", "content": GOOD}}]})  # fmt: skip
    with client(ScriptedPolicy(cut, GOOD)) as api:
        body = post(api, payload()).json()
    assert body["format_ok"] and body["attempts"] == 2
    with client(ScriptedPolicy(cut)) as api:
        body = post(api, payload()).json()
    assert not body["format_ok"] and body["rules"] == []
    assert body["format_error"] == "cut off at the token limit before the state ended"


def test_malformed_json_is_400():
    with client(ScriptedPolicy()) as api:
        reply = api.post(
            "/v1/reasoning-state", content=b'{"question": "x", "facts": [', headers={"content-type": "application/json"}
        )
    assert reply.status_code == 400 and "malformed JSON" in reply.json()["detail"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda p: p.pop("question"), "body.question: Field required"),
        (lambda p: p.pop("facts"), "body.facts: Field required"),
        (lambda p: p.update(facts="F1 F2"), "body.facts"),
        (lambda p: p.update(question=42), "body.question: Input should be a valid string"),
        (lambda p: p["facts"][1].update(turn="9"), "body.facts.1.turn"),
        (lambda p: p["facts"][0].update(kind="rumour"), "body.facts.0.kind"),
        (lambda p: p["facts"][0].update(role="gold"), "body.facts.0.role: Extra inputs are not permitted"),
        (lambda p: p["relations"][0].update(type="REPLACES"), "body.relations.0.type"),
        (lambda p: p.update(facts=[]), "body.facts: List should have at least 1 item"),
    ],
)
def test_missing_and_wrong_typed_fields_are_422_naming_the_field(change, field):
    body = payload()
    change(body)
    policy = ScriptedPolicy()
    with client(policy) as api:
        reply = post(api, body)
    assert reply.status_code == 422, reply.text
    assert field in reply.json()["detail"]
    assert policy.chats == []  # nothing reached the policy


def test_relation_to_an_unknown_fact_is_422():
    body = payload()
    body["relations"].append({"src": "F3", "type": "CONFLICTS_WITH", "dst": "F9"})
    with client(ScriptedPolicy()) as api:
        reply = post(api, body)
    assert reply.status_code == 422
    assert reply.json()["detail"].startswith("body.relations[1].dst: unknown fact id 'F9'")


def test_duplicate_fact_ids_and_a_single_option_are_422():
    body = payload()
    body["facts"][2]["id"] = "F1"
    with client(ScriptedPolicy()) as api:
        assert "duplicate id 'F1'" in post(api, body).json()["detail"]
        body = payload() | {"options": ["only one"]}
        assert post(api, body).json()["detail"] == "body.options: give at least 2 options, or none"


def test_limits_on_facts_text_and_body_size():
    with client(ScriptedPolicy(), max_facts=2, max_text_chars=100, max_body_bytes=4000) as api:
        too_many = post(api, payload())
        long_text = payload(replace(INSTANCE, facts=INSTANCE.facts[:2]))
        long_text["question"] = "why? " * 30
        too_long = post(api, long_text)
        huge = payload() | {"question": "x" * 5000}
        too_big = post(api, huge)
        long_id = payload(replace(INSTANCE, facts=(replace(INSTANCE.facts[0], id="F" * 65),), relations=()))
        too_long_id = post(api, long_id)
    assert too_many.status_code == 422 and too_many.json()["detail"] == "body.facts: 3 items, at most 2 allowed"
    assert too_long_id.json()["detail"] == "body.facts[0].id: 65 characters, at most 64 allowed"
    assert too_long.status_code == 422 and too_long.json()["detail"].startswith("body.question: 150 characters")
    assert too_big.status_code == 413 and "over 4000 bytes" in too_big.json()["detail"]


def test_bearer_token(monkeypatch):
    monkeypatch.setenv("MEMSTATE_TEST_KEY", "s3cret")
    with client(ScriptedPolicy(), auth="token", api_key_env="MEMSTATE_TEST_KEY") as api:
        missing = post(api, payload())
        wrong = post(api, payload(), headers={"Authorization": "Bearer nope"})
        right = post(api, payload(), headers={"Authorization": "Bearer s3cret"})
        health = api.get("/healthz")
    assert missing.status_code == 401 and missing.json()["detail"] == "missing bearer token"
    assert missing.headers["www-authenticate"] == "Bearer"
    assert wrong.status_code == 401 and wrong.json()["detail"] == "wrong bearer token"
    assert right.status_code == 200 and health.status_code == 200


def test_policy_down_is_503():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with client(None, policy_url=url, timeout_s=5) as api:
        reply = post(api, payload())
        health = api.get("/healthz")
        metrics = api.get("/metrics").text
    assert reply.status_code == 503 and reply.json()["detail"] == "the policy is unreachable"  # its URL: in the log
    assert health.status_code == 503
    assert 'memstate_api_policy_errors_total{reason="unreachable"} 1.0' in metrics


@pytest.mark.parametrize(
    ("reply", "status", "words"),
    [
        (httpx.ReadTimeout("slow"), 504, "did not answer within 60.0 s"),
        (httpx.Response(500, text="engine died"), 502, "the policy answered 500"),
        (httpx.Response(200, text="<html>proxy</html>"), 502, "the policy's reply is malformed"),
        (httpx.Response(200, json={"choices": []}), 502, "the policy's reply is malformed"),
        (httpx.Response(400, json={"error": {"message": "maximum context length is 2048 tokens"}}), 422, "too long"),
    ],
)
def test_policy_failures_map_to_status_codes(reply, status, words):
    with client(ScriptedPolicy(reply)) as api:
        answer = post(api, payload())
    assert answer.status_code == status and words in answer.json()["detail"]


def test_facts_are_truncated_to_the_prompt_budget_like_in_training(tiny_models):
    from transformers import AutoTokenizer

    from memstate.prompts import fit_policy_prompt

    tokenizer = AutoTokenizer.from_pretrained(tiny_models["policy"])
    facts = tuple(Fact(f"F{i}", f"Memory number {i} says something about flats.", "fact") for i in range(1, 40))
    inst = replace(INSTANCE, facts=facts, relations=(Relation("F39", "SUPERSEDES", "F1"),))
    budget = 400
    expected, dropped = fit_policy_prompt(tokenizer, inst.question, inst.candidates, facts, inst.relations, budget)
    assert 0 < dropped < len(facts)
    policy = ScriptedPolicy()
    with client(policy, tokenizer=str(tiny_models["policy"]), max_prompt_tokens=budget) as api:
        body = post(api, payload(inst)).json()
    assert body["facts_truncated"] == dropped
    sent = policy.chats[0]["messages"]
    assert sent == expected and inst.question in sent[1]["content"] and "F39 SUPERSEDES" not in sent[1]["content"]


def test_the_prompt_budget_defaults_to_the_checkpoints(tiny_models, tmp_path):
    import shutil

    from memstate.checkpoint import CheckpointMetadata

    facts = tuple(Fact(f"F{i}", f"Memory number {i} says something about flats.", "fact") for i in range(1, 40))
    inst = replace(INSTANCE, facts=facts, relations=())
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_models["policy"], ckpt)
    with client(ScriptedPolicy(), tokenizer=str(ckpt)) as api:  # a base model: the default budget, nothing cut
        assert post(api, payload(inst)).json()["facts_truncated"] == 0
    CheckpointMetadata("v", "base", "responder", "likelihood", 400, 64, "data").write(ckpt)
    with client(ScriptedPolicy(), tokenizer=str(ckpt)) as api:  # trained with 400 prompt tokens: cut to 400
        assert post(api, payload(inst)).json()["facts_truncated"] > 0


def test_openapi_schema_documents_the_endpoint_and_its_errors():
    with client(ScriptedPolicy()) as api:
        schema = api.get("/openapi.json").json()
    op = schema["paths"]["/v1/reasoning-state"]["post"]
    assert {"200", "400", "401", "408", "413", "422", "502", "503", "504"} <= set(op["responses"])
    # The request's facts and relations are the schema's own classes; a fact's role is not part of a request.
    components = schema["components"]["schemas"]
    request = components["ReasoningStateRequest"]["properties"]
    assert request["facts"]["items"]["$ref"].endswith("/ShownFact")
    assert request["relations"]["items"]["$ref"].endswith("/Relation")
    fact = components["ShownFact"]
    assert fact["properties"]["kind"]["enum"] == list(FACT_KINDS) and fact["additionalProperties"] is False
    assert "role" not in fact["properties"] and components["Relation"]["additionalProperties"] is False


@pytest.fixture()
def live_api():
    """The app under a real uvicorn server on a free port (policy scripted), for the clients."""
    from chat_server import live_app

    policy = ScriptedPolicy(BAD, GOOD)
    app = create_app(ApiConfig(auth="none"), policy_transport=httpx.MockTransport(policy))
    with live_app(app) as url:
        yield url


def test_sync_and_async_clients(live_api):
    import asyncio

    from memstate.serve.client import AsyncReasoningStateClient, ReasoningStateClient, ReasoningStateError

    with ReasoningStateClient(live_api) as client:
        assert client.healthy()
        state = client.for_instance(INSTANCE)
        assert state.format_ok and state.attempts == 2 and len(state.rules) == 2 and state.model == "policy-7"
        with pytest.raises(ReasoningStateError) as bad:
            client.reasoning_state(payload() | {"options": ["one"]})
        assert bad.value.status == 422 and bad.value.detail == "body.options: give at least 2 options, or none"

    async def run() -> list:
        async with AsyncReasoningStateClient(live_api, max_connections=4) as client:
            assert await client.healthy()
            return await asyncio.gather(*(client.for_instance(INSTANCE) for _ in range(8)))

    states = asyncio.run(run())
    assert len(states) == 8 and all(s.format_ok for s in states)


def test_policy_retries_when_configured():
    policy = ScriptedPolicy(httpx.Response(503, text="warming up"), httpx.ConnectError("reset"), GOOD)
    with client(policy, policy_retries=2, policy_backoff_s=0.001) as api:
        body = post(api, payload()).json()
    assert body["format_ok"] and body["attempts"] == 1 and len(policy.chats) == 3
    policy = ScriptedPolicy(httpx.ReadTimeout("slow"))
    with client(policy, policy_retries=1, policy_backoff_s=0.001) as api:
        reply = post(api, payload())
    assert reply.status_code == 504 and "(2 attempts)" in reply.json()["detail"] and len(policy.chats) == 2


def test_the_client_retries_the_api_then_says_it_is_unavailable():
    from chat_server import live_app

    from memstate.errors import ServerUnavailable
    from memstate.serve.client import ReasoningStateClient

    app = create_app(ApiConfig(auth="none", policy_url=f"http://127.0.0.1:{free_port()}", timeout_s=5))
    with live_app(app) as url, ReasoningStateClient(url, max_retries=2, backoff=0.001) as api:
        assert not api.healthy()
        with pytest.raises(ServerUnavailable) as down:
            api.for_instance(INSTANCE)
        metrics = api.http.get("/metrics").text
    e = down.value
    assert e.status == 503 and e.attempts == 3 and f"{url}/v1/reasoning-state" in str(e) and "unreachable" in e.body
    assert 'memstate_api_requests_total{path="/v1/reasoning-state",status="503"} 3.0' in metrics
