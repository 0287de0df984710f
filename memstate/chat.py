"""The one OpenAI-compatible chat layer: every client that asks a chat model (the HTTP responder, the memory LLM
client, the MemSyco judge, the serve API's policy) builds its request and reads the reply here, over
``memstate.http``.

``chat_request`` is the body of ``POST /v1/chat/completions`` (``CHAT_COMPLETIONS``); ``chat_reply`` reads
``choices[0]`` of a reply: the message's text and whether generation stopped at ``max_tokens``. ``chat`` and
``achat`` send one request through an ``HTTPClient`` / ``AsyncHTTPClient`` and read it with the client's ``parse``
hook, so a reply without a usable message is a malformed reply, retried within the client's budget like any other.

>>> chat_reply({"choices": [{"message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}]})
ChatReply(text='4', truncated=False)
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, NamedTuple

from memstate.http import AsyncHTTPClient, HTTPClient

__all__ = ["CHAT_COMPLETIONS", "ChatReply", "achat", "chat", "chat_reply", "chat_request"]

CHAT_COMPLETIONS = "/v1/chat/completions"


class ChatReply(NamedTuple):
    """The text of a chat reply's first choice, and whether it was cut off at ``max_tokens``."""

    text: str
    truncated: bool  # finish_reason "length"


def chat_request(
    model: str, messages: Sequence[dict[str, Any]], *, temperature: float, max_tokens: int, **extra: Any
) -> dict[str, Any]:
    """The body of a chat completion request; ``extra`` fields (``chat_template_kwargs``, ``response_format``,
    vLLM's ``logprob_token_ids``, …) go after the four every request has.

    >>> chat_request("m", [], temperature=0.0, max_tokens=8, logprobs=True)
    {'model': 'm', 'messages': [], 'temperature': 0.0, 'max_tokens': 8, 'logprobs': True}
    """
    return {"model": model, "messages": list(messages), "temperature": temperature, "max_tokens": max_tokens, **extra}


def chat_reply(body: Any, *, none_as_empty: bool = False) -> ChatReply:
    """``choices[0]`` of a chat completion reply. ValueError (what is wrong, and the body's first 200 characters)
    when it has no message content, or content that is not text; ``none_as_empty`` reads a null content as "".

    >>> chat_reply({"choices": [{"message": {"content": "A"}, "finish_reason": "length"}]})
    ChatReply(text='A', truncated=True)
    >>> chat_reply({"choices": [{"message": {"content": None}}]}, none_as_empty=True)
    ChatReply(text='', truncated=False)
    >>> chat_reply({"choices": []})
    Traceback (most recent call last):
    ...
    ValueError: the chat reply has no message (choices[0].message.content): {'choices': []}
    """
    try:
        choice = body["choices"][0]
        content = choice["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"the chat reply has no message (choices[0].message.content): {str(body)[:200]}") from None
    if content is None and none_as_empty:
        content = ""
    if not isinstance(content, str):
        kind = type(content).__name__
        raise ValueError(f"the chat reply's message content is {kind}, not text: {str(body)[:200]}")
    return ChatReply(content, choice.get("finish_reason") == "length")


def chat(client: HTTPClient, request: dict[str, Any], *, none_as_empty: bool = False) -> ChatReply:
    """POST ``request`` (``chat_request``) and read the reply (``chat_reply``), with the client's retries: a reply
    without a usable message is retried like any malformed reply. Raises what ``HTTPClient.request`` raises."""
    parse = partial(chat_reply, none_as_empty=none_as_empty)
    return client.request("POST", CHAT_COMPLETIONS, json=request, parse=parse)


async def achat(client: AsyncHTTPClient, request: dict[str, Any], *, none_as_empty: bool = False) -> ChatReply:
    """As ``chat``, on an ``AsyncHTTPClient``."""
    parse = partial(chat_reply, none_as_empty=none_as_empty)
    return await client.request("POST", CHAT_COMPLETIONS, json=request, parse=parse)
