"""The one OpenAI-compatible chat layer (``memstate.chat``): its reply reading, its retries through ``memstate.http``,
and that no other module builds or parses a chat request itself."""

from __future__ import annotations

import ast
import asyncio
import json
import tomllib
from pathlib import Path

import httpx
import pytest

from memstate import http
from memstate.chat import CHAT_COMPLETIONS, ChatReply, achat, chat, chat_reply, chat_request
from memstate.http import AsyncHTTPClient, HTTPClient, HTTPSettings, HTTPUnavailable

ROOT = Path(__file__).resolve().parents[1]


def _reply(content, finish_reason: str | None = "stop") -> dict:
    message = {"role": "assistant", "content": content}
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish_reason}]}


# ---- chat_reply -----------------------------------------------------------------------------------------------------


def test_a_reply_gives_its_text_and_whether_it_was_cut_off():
    assert chat_reply(_reply("B")) == ChatReply("B", False)
    assert chat_reply(_reply("The state", "length")) == ChatReply("The state", True)
    assert chat_reply(_reply("", None)) == ChatReply("", False)  # empty text is text; no finish_reason: not cut off


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"choices": []},
        {"choices": None},
        {"choices": ["text"]},
        {"choices": [{}]},
        {"choices": [{"message": None}]},
        {"choices": [{"message": {"role": "assistant"}}]},
        {"error": {"message": "overloaded"}},
        [],
        "not a dict",
    ],
)
def test_a_reply_without_a_message_is_a_value_error_showing_the_body(body):
    with pytest.raises(ValueError, match=r"has no message \(choices\[0\]\.message\.content\)") as caught:
        chat_reply(body)
    assert str(body)[:200] in str(caught.value)


@pytest.mark.parametrize(("content", "kind"), [(None, "NoneType"), (7, "int"), (["a"], "list"), ({"t": 1}, "dict")])
def test_content_that_is_not_text_is_a_value_error_naming_its_type(content, kind):
    with pytest.raises(ValueError, match=f"message content is {kind}, not text"):
        chat_reply(_reply(content))


def test_none_as_empty_reads_null_content_as_empty_text_and_nothing_else():
    assert chat_reply(_reply(None), none_as_empty=True) == ChatReply("", False)
    with pytest.raises(ValueError, match="content is int"):
        chat_reply(_reply(3), none_as_empty=True)
    with pytest.raises(ValueError, match="has no message"):  # a missing content is still no message
        chat_reply({"choices": [{"message": {}}]}, none_as_empty=True)


def test_the_error_shows_at_most_200_characters_of_the_body():
    body = {"choices": [], "padding": "x" * 1000}
    with pytest.raises(ValueError) as caught:
        chat_reply(body)
    assert str(body)[:200] in str(caught.value) and str(body)[:201] not in str(caught.value)


def test_a_request_holds_the_four_fields_then_the_extra_ones():
    messages = ({"role": "user", "content": "hi"},)
    body = chat_request("m", messages, temperature=0.3, max_tokens=16, chat_template_kwargs={"enable_thinking": False})
    assert list(body) == ["model", "messages", "temperature", "max_tokens", "chat_template_kwargs"]
    assert body["messages"] == list(messages) and json.loads(json.dumps(body)) == body


# ---- chat / achat: through the HTTP layer ---------------------------------------------------------------------------


class Script:
    """Replies in order (a dict: 200 with that JSON); records the requests."""

    def __init__(self, *replies: dict):
        self.replies, self.requests = list(replies), []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((request.method, request.url.path, json.loads(request.content)))
        return httpx.Response(200, json=self.replies.pop(0))


@pytest.fixture(autouse=True)
def no_waits(monkeypatch):
    monkeypatch.setattr(http, "_sleep", lambda s: None)

    async def asleep(s):
        return None

    monkeypatch.setattr(http, "_asleep", asleep)


SETTINGS = HTTPSettings("http://policy", max_retries=2, backoff=0.0)
REQUEST = chat_request("m", [{"role": "user", "content": "hi"}], temperature=0.0, max_tokens=4)


def test_chat_posts_the_request_and_retries_a_reply_without_a_message():
    script = Script({"choices": []}, _reply("ok", "length"))
    with HTTPClient(SETTINGS, transport=httpx.MockTransport(script)) as client:
        assert chat(client, REQUEST) == ChatReply("ok", True)
        assert client.stats.bad_replies == 1 and client.stats.retries == 1
    assert script.requests == [("POST", CHAT_COMPLETIONS, REQUEST)] * 2


def test_chat_gives_up_with_the_reply_error_after_the_budget():
    script = Script(*[_reply(None)] * 3)
    with HTTPClient(SETTINGS, transport=httpx.MockTransport(script)) as client:
        with pytest.raises(HTTPUnavailable) as caught:
            chat(client, REQUEST)
    assert caught.value.kind == "reply" and caught.value.attempts == 3
    assert "malformed reply: the chat reply's message content is NoneType, not text" in caught.value.last


def test_chat_with_none_as_empty_accepts_a_null_content():
    script = Script(_reply(None))
    with HTTPClient(SETTINGS, transport=httpx.MockTransport(script)) as client:
        assert chat(client, REQUEST, none_as_empty=True) == ChatReply("", False)


def test_achat_is_the_async_twin():
    script = Script({"choices": [{"message": {}}]}, _reply("yes"))

    async def run():
        async with AsyncHTTPClient(SETTINGS, transport=httpx.MockTransport(script)) as client:
            return await achat(client, REQUEST), client.stats.bad_replies

    assert asyncio.run(run()) == (ChatReply("yes", False), 1)
    assert [path for _, path, _ in script.requests] == [CHAT_COMPLETIONS] * 2


# ---- one place builds and parses chat requests ----------------------------------------------------------------------


def _package_dirs() -> list[Path]:
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return sorted({ROOT / folder for folder in setup["package-dir"].values()})


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
        and isinstance(node.body[0].value.value, str)
    }


def _is_key(node: ast.AST, value: object) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is type(value) and node.value == value


def _own_chat_code(path: Path, root: Path = ROOT) -> list[str]:
    """Where a module spells the chat path itself or reads ``[...]["choices"][0]["message"]``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if CHAT_COMPLETIONS in node.value:
                found.append(f"{path.relative_to(root)}:{node.lineno}: the string {CHAT_COMPLETIONS!r}")
        if (
            isinstance(node, ast.Subscript)
            and _is_key(node.slice, "message")
            and isinstance(node.value, ast.Subscript)
            and _is_key(node.value.slice, 0)
            and isinstance(node.value.value, ast.Subscript)
            and _is_key(node.value.value.slice, "choices")
        ):
            found.append(f"{path.relative_to(root)}:{node.lineno}: indexes ['choices'][0]['message']")
    return found


def test_only_memstate_chat_builds_and_parses_chat_requests():
    dirs = _package_dirs()
    assert {d.name for d in dirs} >= {"memstate", "reward", "serve", "evaluate", "memory"}
    files = [p for d in dirs for p in sorted(d.rglob("*.py")) if p != ROOT / "memstate" / "chat.py"]
    assert len(files) > 50
    assert [hit for p in files for hit in _own_chat_code(p)] == []


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ('URL = "/v1/chat/completions"', True),
        ('def f(c):\n    return c.post(f"{c.root}/v1/chat/completions")', True),
        ('def f(body):\n    return body["choices"][0]["message"]["content"]', True),
        ('def f():\n    """POST /v1/chat/completions."""', False),
        ('def f(body):\n    return body["choices"][0]["logprobs"]', False),
        ("from memstate.chat import CHAT_COMPLETIONS", False),
    ],
)
def test_the_check_catches_a_module_of_its_own(tmp_path, source, caught):
    path = tmp_path / "module.py"
    path.write_text(source + "\n")
    assert bool(_own_chat_code(path, root=tmp_path)) is caught
