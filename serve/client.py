"""A small client of the reasoning-state API, sync and async, for the memory pipeline and ``evaluate``.

>>> payload("Where do I live?", [Fact("F1", "I live in Oslo.", "fact")])["facts"]
[{'id': 'F1', 'text': 'I live in Oslo.', 'kind': 'fact', 'scope': 'global', 'turn': None, 'time': None}]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from memstate.errors import MemstateError
from memstate.schema import Fact, Instance, Relation


@dataclass(frozen=True)
class ReasoningState:
    """The API's answer. ``rules`` is empty when ``format_ok`` is false: answer without a state then."""

    rules: tuple[str, ...]
    text: str
    format_ok: bool
    format_error: str | None
    attempts: int
    facts_truncated: int
    model: str
    prompt_version: str
    latency_ms: float


class ReasoningStateError(MemstateError, RuntimeError):
    """The API answered with an error status (4xx: the request; 502/503/504: the policy behind it)."""

    def __init__(self, status: int, detail: str):
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.detail = status, detail


def payload(
    question: str, facts: Sequence[Fact], relations: Sequence[Relation] = (), options: Sequence[str] = ()
) -> dict:
    """The request body; a fact's ``role`` (analysis only) is never sent."""
    return {
        "question": question,
        "facts": [
            {"id": f.id, "text": f.text, "kind": f.kind, "scope": f.scope, "turn": f.turn, "time": f.time}
            for f in facts
        ],
        "relations": [{"src": r.src, "type": r.type, "dst": r.dst} for r in relations],
        "options": list(options),
    }


def instance_payload(instance: Instance) -> dict:
    """An Instance as a request: its closed answer set (labels or options) as options, as the policy was trained."""
    return payload(instance.question, instance.facts, instance.relations, instance.candidates)


def _parse(reply: httpx.Response) -> ReasoningState:
    if reply.status_code != 200:
        try:
            detail = reply.json()["detail"]
        except (ValueError, KeyError, TypeError):
            detail = reply.text[:300]
        raise ReasoningStateError(reply.status_code, str(detail))
    body = reply.json()
    return ReasoningState(
        rules=tuple(body["rules"]),
        text=body["text"],
        format_ok=body["format_ok"],
        format_error=body.get("format_error"),
        attempts=body["attempts"],
        facts_truncated=body["facts_truncated"],
        model=body["model"],
        prompt_version=body["prompt_version"],
        latency_ms=body["latency_ms"],
    )


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class ReasoningStateClient:
    """Blocking client: ``with ReasoningStateClient(url) as c: c.for_instance(inst)``."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 120.0):
        self.http = httpx.Client(base_url=base_url.rstrip("/"), headers=_headers(api_key), timeout=timeout)

    def reasoning_state(self, body: dict) -> ReasoningState:
        return _parse(self.http.post("/v1/reasoning-state", json=body))

    def for_instance(self, instance: Instance) -> ReasoningState:
        return self.reasoning_state(instance_payload(instance))

    def healthy(self) -> bool:
        try:
            return self.http.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ReasoningStateClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncReasoningStateClient:
    """Async client on one connection pool (``max_connections`` requests in flight)."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 120.0, max_connections: int = 64):
        self.http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=_headers(api_key),
            timeout=timeout,
            limits=httpx.Limits(max_connections=max_connections),
        )

    async def reasoning_state(self, body: dict) -> ReasoningState:
        return _parse(await self.http.post("/v1/reasoning-state", json=body))

    async def for_instance(self, instance: Instance) -> ReasoningState:
        return await self.reasoning_state(instance_payload(instance))

    async def healthy(self) -> bool:
        try:
            return (await self.http.get("/healthz")).status_code == 200
        except httpx.HTTPError:
            return False

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncReasoningStateClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
