"""A small JSON chat client for the memory backends' LLM decisions (CLAG's router, profiles and cluster choice;
MemSearch-o1's fragment extraction and sub-queries): any OpenAI-compatible ``/v1/chat/completions`` endpoint, asked
for JSON through ``response_format: json_schema``, with httpx like ``memstate.memory.llm_extractor``.

Transport errors, 429 and 5xx are retried with backoff; a reply that is not JSON or breaks the schema is retried
too. When every attempt failed, ``LLMError`` says why — the callers then fall back to their rule-based decision and
label it as such, so one bad reply never stops an ingest or a query.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Sequence
from typing import Any

import httpx
import jsonschema_rs

logger = logging.getLogger("memstate.memory")

_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


class LLMError(RuntimeError):
    """No usable reply: the server failed or kept answering something that is not the asked-for JSON.

    ``invalid``: attempts whose reply was not the asked-for JSON; ``failed``: attempts the server failed (transport,
    429, 5xx); ``rejected``: the request itself was refused (another 4xx, not retried)."""

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
    """``ask(messages, schema, name)`` → the reply's JSON object. ``url`` is the server root (``/v1`` optional)."""

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
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=base, headers=headers, timeout=timeout)
        self.url, self.model, self.retries, self.backoff = base, model, retries, backoff
        self.temperature, self.max_tokens = temperature, max_tokens
        self.calls = 0
        self.failures = 0
        self._validators: dict[str, Any] = {}

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
        body = {
            "model": self.model,
            "messages": list(messages),
            "temperature": self.temperature if temperature is None else temperature,
            "max_tokens": self.max_tokens,
            "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}},
        }
        invalid: list[str] = []
        failed: list[str] = []
        for attempt in range(1, self.retries + 2):
            if attempt > 1:
                time.sleep(self.backoff * 2 ** (attempt - 2))
            self.calls += 1
            try:
                reply = self.http.post("/v1/chat/completions", json=body)
            except httpx.HTTPError as e:
                failed.append(f"attempt {attempt}: {type(e).__name__}: {e}")
                continue
            if reply.status_code == 429 or reply.status_code >= 500:
                failed.append(f"attempt {attempt}: HTTP {reply.status_code}")
                continue
            if reply.status_code != 200:  # the request itself is wrong: retrying will not help
                self.failures += 1
                raise LLMError(invalid, failed, f"HTTP {reply.status_code} from {self.url}: {reply.text[:300]}")
            try:
                content = reply.json()["choices"][0]["message"]["content"]
                if not isinstance(content, str):
                    raise TypeError(f"message content is {type(content).__name__}")
                return parse_json_reply(content, validator)
            except (ValueError, KeyError, IndexError, TypeError) as e:
                invalid.append(f"attempt {attempt}: invalid reply: {e}")
                logger.warning("%s: %s reply rejected (%s)", self.url, name, invalid[-1])
        self.failures += 1
        error = LLMError(invalid, failed)
        logger.warning("%s: no usable %s reply (%s)", self.url, name, error)
        raise error

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ChatJSON:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
