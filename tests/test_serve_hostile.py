"""The reasoning-state API against a careless operator and a hostile client (issue 56): auth never fails open (the
shell's key wins over a config's ``env:``, no key means no start unless auth is switched off, docs and metrics
behind the token), no internal URL or exception text in an answer (the request id instead, and in the log), a body
that never arrives gets 408, and every text field is bounded and must be visible.

The policy is ``test_serve_api.ScriptedPolicy`` (an ``httpx.MockTransport``), or a port nobody listens on.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket

import httpx
import pytest
from fastapi.testclient import TestClient
from test_serve_api import GOOD, ScriptedPolicy, payload, post

from memstate.errors import ConfigError
from memstate.serve.api import ApiConfig, create_app
from memstate.serve.cli import api_parser
from memstate.serve.policy import free_port

KEY_ENV = "MEMSTATE_HOSTILE_TEST_KEY"
AUTH = {"Authorization": "Bearer s3cret"}
DOCS = ("/docs", "/redoc", "/openapi.json")


def app_with_key(monkeypatch, policy: ScriptedPolicy | None = None, **overrides) -> TestClient:
    monkeypatch.setenv(KEY_ENV, "s3cret")
    config = ApiConfig(api_key_env=KEY_ENV, **overrides)
    return TestClient(create_app(config, policy_transport=httpx.MockTransport(policy or ScriptedPolicy())))


def unset(monkeypatch, name: str) -> None:
    """``name`` absent from the environment now, and as it was after the test (setenv records the original)."""
    monkeypatch.setenv(name, "")
    monkeypatch.delenv(name)


# --- auth never fails open ---------------------------------------------------------------------------------------


def test_the_shells_key_wins_over_a_configs_env_block(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv(KEY_ENV, "s3cret")
    unset(monkeypatch, "MEMSTATE_HOSTILE_CONFIG_ONLY")
    config_file = tmp_path / "api.yaml"
    config_file.write_text(
        f"api_key_env: {KEY_ENV}\nenv:\n  {KEY_ENV}: ''\n  MEMSTATE_HOSTILE_CONFIG_ONLY: from-the-config\n"
    )
    with caplog.at_level(logging.WARNING, logger="memstate.parsing"):
        (config,) = api_parser().parse_args_and_config(["--config", str(config_file)])
    assert os.environ[KEY_ENV] == "s3cret"  # the empty value did not switch auth off
    assert os.environ["MEMSTATE_HOSTILE_CONFIG_ONLY"] == "from-the-config"  # a variable the shell lacks is set
    (kept,) = [r.getMessage() for r in caplog.records if r.name == "memstate.parsing"]
    assert KEY_ENV in kept and "MEMSTATE_HOSTILE_CONFIG_ONLY" not in kept and "s3cret" not in kept
    with TestClient(create_app(config, policy_transport=httpx.MockTransport(ScriptedPolicy()))) as api:
        assert post(api, payload()).status_code == 401
        assert post(api, payload(), headers=AUTH).status_code == 200


@pytest.mark.parametrize("value", [None, "", "  "])
def test_no_key_no_start(monkeypatch, value):
    if value is None:
        unset(monkeypatch, KEY_ENV)  # unset, or a misspelt api_key_env
    else:
        monkeypatch.setenv(KEY_ENV, value)
    with pytest.raises(ConfigError) as refused:
        create_app(ApiConfig(api_key_env=KEY_ENV))
    message = str(refused.value)
    assert "\n" not in message and f"${KEY_ENV} (api_key_env) is unset or empty" in message
    assert "--no-auth" in message and "auth: none" in message


def test_the_cli_refuses_in_one_line_and_serves_open_only_when_told(monkeypatch, capsys, caplog):
    from memstate.cli import main

    unset(monkeypatch, KEY_ENV)
    assert main(["serve", "api", "--config", "configs/serve/api.yaml", "--api_key_env", KEY_ENV]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"memstate serve api: error: auth: token, but ${KEY_ENV} ") and "--no-auth" in line
    assert api_parser().parse_args_and_config(["--no-auth"])[0].auth == "none"
    with pytest.raises(ConfigError, match="auth: token needs api_key_env"):
        api_parser().parse_args_and_config(["--api_key_env", ""])
    with caplog.at_level(logging.WARNING, logger="memstate.serve"):
        app = create_app(ApiConfig(api_key_env=KEY_ENV, auth="none"))
    assert any(r.levelno == logging.WARNING and r.getMessage().startswith("auth: off") for r in caplog.records)
    with TestClient(app) as api:
        assert api.get("/metrics").status_code == 200 and api.get("/openapi.json").status_code == 200


def test_docs_and_metrics_need_the_token(monkeypatch):
    with app_with_key(monkeypatch) as api:
        for path in (*DOCS, "/metrics"):
            missing, right = api.get(path), api.get(path, headers=AUTH)
            assert missing.status_code == 401, path
            assert missing.json()["detail"] == "missing bearer token" and "paths" not in missing.text
            assert api.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401, path
            assert right.status_code == 200, path
        assert "/v1/reasoning-state" in api.get("/openapi.json", headers=AUTH).json()["paths"]
        assert "memstate_api_requests_total" in api.get("/metrics", headers=AUTH).text
        assert api.get("/healthz").status_code == 200  # open: load balancers probe it


@pytest.mark.parametrize(("switch", "public"), [("public_docs", DOCS), ("public_metrics", ("/metrics",))])
def test_docs_and_metrics_can_be_exposed(monkeypatch, switch, public):
    with app_with_key(monkeypatch, **{switch: True}) as api:
        for path in (*DOCS, "/metrics"):
            assert api.get(path).status_code == (200 if path in public else 401), path
        assert post(api, payload()).status_code == 401  # the API itself stays behind the token


# --- no internals in an answer -----------------------------------------------------------------------------------


def test_policy_down_names_no_url_or_exception_only_the_request_id(caplog):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    app = create_app(ApiConfig(auth="none", policy_url=url, timeout_s=5))
    with caplog.at_level(logging.INFO, logger="memstate.serve"), TestClient(app) as api:
        answers = [post(api, payload()), api.get("/healthz"), api.get("/healthz", headers={"X-Request-ID": "lb-7"})]
    log = "\n".join(r.getMessage() for r in caplog.records)
    for answer in answers:
        body = answer.json()
        assert answer.status_code == 503 and body["detail"].startswith("the policy is unreachable")
        for internal in (url, "127.0.0.1", "ConnectError", "connection attempts failed"):
            assert internal not in answer.text
        assert body["request_id"] == answer.headers["x-request-id"]
        assert f"request {body['request_id']}: " in log  # the details are in the server's log, under that id
    assert answers[2].json()["request_id"] == "lb-7"  # a sane client id is kept
    assert url in log


@pytest.mark.parametrize(
    ("reply", "status", "secret"),
    [
        (httpx.ReadTimeout("read timed out"), 504, "http://127.0.0.1:8000/v1/chat/completions"),  # the URL
        (httpx.Response(500, text="Traceback: CUDA out of memory on node-17"), 502, "node-17"),
        (httpx.Response(200, text="<html>proxy internal-gw</html>"), 502, "internal-gw"),
        (httpx.Response(400, json={"error": {"message": "context length 2048 at worker-3"}}), 422, "worker-3"),
    ],
)
def test_policy_failures_answer_without_the_policys_words(reply, status, secret, caplog):
    with caplog.at_level(logging.WARNING, logger="memstate.serve"):
        app = create_app(ApiConfig(auth="none"), policy_transport=httpx.MockTransport(ScriptedPolicy(reply)))
        with TestClient(app) as api:
            answer = post(api, payload())
    assert answer.status_code == status
    assert secret not in answer.text and "127.0.0.1:8000" not in answer.text
    (logged,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("request ")]
    assert logged.startswith(f"request {answer.json()['request_id']}: policy call failed") and secret in logged


def test_a_policy_reply_longer_than_max_tokens_allows_is_502_and_not_echoed(caplog):
    """A misrouted or hostile policy answering megabytes: 502 with a short body, the size in the server's log."""
    huge = "- " + "word " * 200_000
    with caplog.at_level(logging.WARNING, logger="memstate.serve"):
        app = create_app(
            ApiConfig(auth="none", max_tokens=512), policy_transport=httpx.MockTransport(ScriptedPolicy(huge))
        )
        with TestClient(app) as api:
            answer = post(api, payload())
    assert answer.status_code == 502 and len(answer.content) < 1000
    assert answer.json()["detail"] == "the policy's reply is longer than max_tokens allows"
    assert any("a reply of 1000002 characters" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("given", ["a b", "x" * 129, "id;X-Evil=1", ""])
def test_an_insane_request_id_is_replaced(given):
    with TestClient(create_app(ApiConfig(auth="none"), policy_transport=httpx.MockTransport(ScriptedPolicy()))) as api:
        answer = api.get("/healthz", headers={"X-Request-ID": given})
        refused = post(api, {"question": "?"}, headers={"X-Request-ID": given})
    assert answer.status_code == 200 and len(answer.headers["x-request-id"]) == 32
    assert refused.status_code == 422 and refused.json()["request_id"] == refused.headers["x-request-id"] != given


# --- a body that never arrives -----------------------------------------------------------------------------------


def _raw_request(url: str, body: bytes, *, drip: bool) -> tuple[bytes, int]:
    """Send a POST's headers (declaring 100 bytes), then ``body`` at once, or a byte at a time until the server
    answers; everything the server sends until it closes, and the body bytes sent."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/reasoning-state HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n")  # fmt: skip
        sent = 0
        try:
            if drip:  # a byte every 0.2 s: never a second without one, so only a deadline for the whole body ends it
                while sent < 100 and not select.select([s], [], [], 0.2)[0]:
                    s.sendall(body[sent : sent + 1])
                    sent += 1
            else:
                s.sendall(body)
                sent = len(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed between a select and a send: its answer is still to be read
        received = b""
        try:
            while chunk := s.recv(65536):  # b"": the server closed the connection (a hang: the 30 s socket timeout)
                received += chunk
        except ConnectionResetError:
            pass  # a reset after the answer (a byte sent as the server closed)
    return received, sent


@pytest.mark.parametrize("drip", [False, True], ids=["headers-only", "dripped"])
def test_a_body_not_in_within_body_timeout_s_is_408_and_the_connection_closed(drip):
    from chat_server import live_app

    app = create_app(ApiConfig(auth="none", body_timeout_s=1.0), policy_transport=httpx.MockTransport(ScriptedPolicy()))
    with live_app(app) as url:
        received, sent = _raw_request(url, b"" if not drip else b" " * 100, drip=drip)
        assert httpx.get(f"{url}/healthz").status_code == 200  # the server itself is fine
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head.lower()
    assert json.loads(body)["detail"] == "request body not received within 1 s" and sent < 100


# --- every text bounded, and visible -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        (
            lambda p: p["facts"][0].update(time="2" * 150_000),
            "body.facts[0].time: 150000 characters, at most 64 allowed",
        ),
        (lambda p: p["facts"][0].update(time="2024-05-01" + "x" * 55), "body.facts[0].time: 65 characters"),
        (lambda p: p["relations"][0].update(dst="F" * 5000), "body.relations[0].dst: 5000 characters, at most 64"),
        (lambda p: p["options"].__setitem__(0, "o" * 8001), "body.options[0]: 8001 characters, at most 8000"),
    ],
)
def test_every_text_field_is_bounded(change, detail):
    body = payload()
    change(body)
    policy = ScriptedPolicy()
    with TestClient(create_app(ApiConfig(auth="none"), policy_transport=httpx.MockTransport(policy))) as api:
        answer = post(api, body)
    assert answer.status_code == 422 and answer.json()["detail"].startswith(detail)
    assert len(answer.text) < 500 and policy.chats == []  # the text is not echoed back, nor sent on


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("question", "\x00\x00\x00"),
        ("question", "\u200b\u200b"),
        ("question", "\ufeff \u200b\t\u2060"),
        ("facts.0.text", "\u200b"),
        ("facts.1.time", "\x00"),
        ("options.2", "\x1b\x07"),
    ],
)
def test_a_text_of_invisible_characters_only_is_blank(field, value):
    body = payload()
    *path, last = field.split(".")
    target = body
    for part in path:
        target = target[int(part)] if part.isdigit() else target[part]
    target[int(last) if last.isdigit() else last] = value
    policy = ScriptedPolicy()
    with TestClient(create_app(ApiConfig(auth="none"), policy_transport=httpx.MockTransport(policy))) as api:
        answer = post(api, body)
        visible = post(api, payload() | {"question": "\u200bWhere\x00 do I live?"})
    assert answer.status_code == 422 and "must not be blank" in answer.json()["detail"]
    assert len(policy.chats) == 1  # the visible question's: the blank one reached no policy
    assert visible.status_code == 200 and visible.json()["text"] == GOOD  # invisible characters around text: fine
