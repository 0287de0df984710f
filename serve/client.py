"""A small client of the reasoning-state API, sync and async, for the memory pipeline and ``evaluate``, over
``memstate.http``: transport errors, timeouts, 429 and the API's 502/503/504 (the policy behind it failing) are
retried with backoff; after the last attempt ``memstate.http.HTTPUnavailable`` (a ``ServerUnavailable``) names the
URL and every attempt. A 4xx is ``ReasoningStateError`` at once.

>>> payload("Where do I live?", [Fact("F1", "I live in Oslo.", "fact")])["facts"]
[{'id': 'F1', 'text': 'I live in Oslo.', 'kind': 'fact', 'scope': 'global', 'turn': None, 'time': None}]
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from memstate.errors import MemstateError
from memstate.http import AsyncHTTPClient, HTTPClient, HTTPRejected, HTTPSettings, HTTPUnavailable
from memstate.schema import Fact, Instance, Relation
from memstate.serve.shapes import ReasoningStateRequest, ReasoningStateResponse


class ReasoningStateError(MemstateError, RuntimeError):
    """The API refused the request (4xx; ``detail`` says which field). Failures of the API or of the policy behind
    it (5xx) are retried and end in ``memstate.http.HTTPUnavailable``."""

    def __init__(self, status: int, detail: str):
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.detail = status, detail


def payload(
    question: str, facts: Sequence[Fact], relations: Sequence[Relation] = (), options: Sequence[str] = ()
) -> dict:
    """The request body. A fact's ``role`` (analysis only) is never sent: the request's facts are ``ShownFact``s."""
    # Not validated here: the API does, and its 422 names the field (ReasoningStateError).
    request = ReasoningStateRequest.model_construct(
        question=question, facts=list(facts), relations=list(relations), options=list(options)
    )
    return request.model_dump(mode="json")


def instance_payload(instance: Instance) -> dict:
    """An Instance as a request: its closed answer set (labels or options) as options, as the policy was trained."""
    return payload(instance.question, instance.facts, instance.relations, instance.candidates)


PATH = "/v1/reasoning-state"


def _state(body: dict) -> ReasoningStateResponse:
    return ReasoningStateResponse.model_validate(body)


def _refused(e: HTTPRejected) -> ReasoningStateError:
    try:
        detail = json.loads(e.text)["detail"]
    except (ValueError, KeyError, TypeError):
        detail = e.text[:300]
    return ReasoningStateError(e.status, str(detail))


def _settings(base_url: str, api_key: str | None, timeout: float, max_retries: int, backoff: float, n: int):
    return HTTPSettings(base_url, api_key=api_key, timeout=timeout, max_retries=max_retries, backoff=backoff,
                        concurrency=n)  # fmt: skip


class ReasoningStateClient:
    """Blocking client: ``with ReasoningStateClient(url) as c: c.for_instance(inst)``. ``http``: the underlying
    ``httpx.Client`` (base URL and auth set) for other endpoints such as ``/metrics``."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 2,
        backoff: float = 0.5,
        max_connections: int = 16,
    ):
        self.client = HTTPClient(_settings(base_url, api_key, timeout, max_retries, backoff, max_connections))
        self.http = self.client.http

    def reasoning_state(self, body: dict) -> ReasoningStateResponse:
        try:
            return self.client.request("POST", PATH, json=body, parse=_state)
        except HTTPRejected as e:
            raise _refused(e) from None

    def for_instance(self, instance: Instance) -> ReasoningStateResponse:
        return self.reasoning_state(instance_payload(instance))

    def healthy(self) -> bool:
        try:
            return self.client.send("GET", "/healthz", retry=False).status_code == 200
        except HTTPUnavailable:
            return False

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> ReasoningStateClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncReasoningStateClient:
    """Async client on one connection pool (``max_connections`` requests in flight)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_connections: int = 64,
        max_retries: int = 2,
        backoff: float = 0.5,
    ):
        self.client = AsyncHTTPClient(_settings(base_url, api_key, timeout, max_retries, backoff, max_connections))
        self.http = self.client.http

    async def reasoning_state(self, body: dict) -> ReasoningStateResponse:
        try:
            return await self.client.request("POST", PATH, json=body, parse=_state)
        except HTTPRejected as e:
            raise _refused(e) from None

    async def for_instance(self, instance: Instance) -> ReasoningStateResponse:
        return await self.reasoning_state(instance_payload(instance))

    async def healthy(self) -> bool:
        try:
            return (await self.client.send("GET", "/healthz", retry=False)).status_code == 200
        except HTTPUnavailable:
            return False

    async def aclose(self) -> None:
        await self.client.aclose()

    async def __aenter__(self) -> AsyncReasoningStateClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
