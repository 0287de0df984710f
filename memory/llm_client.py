"""A small JSON chat client for the memory backends' LLM decisions (CLAG's router, profiles and cluster choice;
MemSearch-o1's fragment extraction and sub-queries): any OpenAI-compatible ``/v1/chat/completions`` endpoint, asked
for JSON through ``response_format: json_schema``, over ``memstate.chat`` and ``memstate.http`` (the chat and HTTP
layers of every client).

Two budgets, ``retries`` each. Transport errors, timeouts, 429, 5xx and bodies without a message are the HTTP layer's
(retried with backoff and jitter); a server still failing after them ends the call. A message that is not JSON or
breaks the schema is a content retry: the same request is asked again. When neither gave a usable reply,
``LLMError`` says why — the callers then fall back to their rule-based decision and label it as such, so one bad
reply never stops an ingest or a query.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any

import jsonschema_rs

from memstate.chat import chat, chat_request
from memstate.http import HTTPClient, HTTPRejected, HTTPSettings, HTTPUnavailable

logger = logging.getLogger("memstate.memory")

_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


class LLMError(RuntimeError):
    """No usable reply: the server failed or kept answering something that is not the asked-for JSON.

    ``invalid``: asks whose reply was not the asked-for JSON; ``failed``: the attempts of the last ask, which the
    server failed (transport, timeout, 429, 5xx, a body without a message); ``rejected``: the request itself was
    refused (another 4xx, not retried)."""

    def __init__(self, invalid: list[str], failed: list[str], rejected: str | None = None):
        super().__init__("; ".join(invalid + failed + ([rejected] if rejected else [])))
        self.invalid, self.failed, self.rejected = invalid, failed, rejected


def parse_json_reply(content: str, validator: Any) -> dict[str, Any]:
    """The JSON object of a reply (a ``<think>`` block and a code fence tolerated), checked against ``validator``;
    ValueError naming what is wrong.

    >>> v = jsonschema_rs.validator_for({"type": "object", "required": ["a"]})
    >>> parse_json_reply('<think>hm</think>```json\\n{"a": 1}\\n```', v)
    {'a': 1}
    """
    text = _FENCE.sub("", _THINK.sub("", content).strip())
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e.msg} at column {e.colno}: {text[:80]!r}") from None
    error = next(iter(validator.iter_errors(data)), None)
    if error is not None:
        path = "/".join(map(str, error.instance_path)) or "(reply)"
        raise ValueError(f"schema: {path}: {error.message}")
    return data


class ChatJSON:
    """``ask(messages, schema, name)`` → the reply's JSON object. ``url`` is the server root (``/v1`` optional).
    ``retries`` bounds both the HTTP layer's retries of one request and the re-asks after invalid content."""

    def __init__(
        self,
        url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        retries: int = 2,
        backoff: float = 0.5,
        temperature: float = 0.0,
        max_tokens: int = 1024,
    ) -> None:
        base = url.rstrip("/").removesuffix("/v1")
        settings = HTTPSettings(base, api_key=api_key, timeout=timeout, max_retries=retries, backoff=backoff)
        self.http = HTTPClient(settings)
        self.url, self.model, self.retries, self.backoff = base, model, retries, backoff
        self.temperature, self.max_tokens = temperature, max_tokens
        self.failures = 0
        self._validators: dict[str, Any] = {}

    @property
    def calls(self) -> int:
        """HTTP requests sent (retries included)."""
        return self.http.stats.requests

    def describe(self) -> dict[str, Any]:
        return {"url": self.url, "model": self.model, "temperature": self.temperature}

    def ask(
        self,
        messages: Sequence[dict[str, str]],
        schema: dict[str, Any],
        name: str,
        *,
        temperature: float | None = None,
    ) -> dict[str, Any]:
        """The JSON reply to ``messages``, valid under ``schema``; ``LLMError`` after the retries."""
        key = json.dumps(schema, sort_keys=True)
        validator = self._validators.get(key)
        if validator is None:
            validator = self._validators[key] = jsonschema_rs.validator_for(schema)
        body = chat_request(
            self.model,
            messages,
            temperature=self.temperature if temperature is None else temperature,
            max_tokens=self.max_tokens,
            response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}},
        )
        invalid: list[str] = []
        for ask in range(1, self.retries + 2):
            try:
                content = chat(self.http, body).text
            except HTTPRejected as e:  # the request itself is wrong: asking again will not help
                self.failures += 1
                raise LLMError(invalid, [], f"HTTP {e.status} from {self.url}: {e.text[:300]}") from None
            except HTTPUnavailable as e:
                self.failures += 1
                error = LLMError(invalid, [f"attempt {i}: {err}" for i, err in enumerate(e.errors, 1)])
                logger.warning("%s: no usable %s reply (%s)", self.url, name, error)
                raise error from None
            try:
                return parse_json_reply(content, validator)
            except ValueError as e:
                invalid.append(f"ask {ask}: invalid reply: {e}")
                logger.warning("%s: %s reply rejected (%s)", self.url, name, invalid[-1])
        self.failures += 1
        error = LLMError(invalid, [])
        logger.warning("%s: no usable %s reply (%s)", self.url, name, error)
        raise error

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ChatJSON:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
