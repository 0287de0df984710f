"""A small client of the reasoning-state API, sync and async, for the memory pipeline and ``evaluate``, over
``memstate.http``: transport errors, timeouts, 429 and the API's 502/503/504 (the policy behind it failing) are
retried with backoff; after the last attempt ``memstate.http.HTTPUnavailable`` (a ``ServerUnavailable``) names the
URL and every attempt. A 4xx is ``ReasoningStateError`` at once.

Backpressure: a 429 or 503 with ``Retry-After`` (the API at capacity, or a request that waited in its queue past its
deadline) is retried after the seconds the API asks (``memstate.http``: capped at ``max_delay``, and never past
``deadline`` when one is given); when the last attempt is refused too, ``ReasoningStateBusy`` says so in one line.
Every request sends ``X-Request-Timeout`` (the per-attempt ``timeout``, or ``deadline`` when shorter), so the API
never keeps it queued past the point where this client has given up on it.

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

TIMEOUT_HEADER = "X-Request-Timeout"


class ReasoningStateError(MemstateError, RuntimeError):
    """The API refused the request (4xx; ``detail`` says which field). Failures of the API or of the policy behind
    it (5xx) are retried and end in ``memstate.http.HTTPUnavailable``."""

    def __init__(self, status: int, detail: str):
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.detail = status, detail


class ReasoningStateBusy(HTTPUnavailable):
    """The API refused every attempt for want of capacity (429 or 503 with ``Retry-After``): it is overloaded, not
    down. One line: the URL, the attempts, the last status, the API's own words and the wait it asked for."""

    hint = "the API is overloaded; retry later, or raise the API's max_concurrency/max_queue or the client's retries"

    def __init__(self, e: HTTPUnavailable):
        super().__init__(e.method, e.url, e.errors, e.kind, e.status, e.body, attempts=e.attempts,
                         deadline=e.deadline, retry_after=e.retry_after)  # fmt: skip
        try:
            detail = str(json.loads(e.body)["detail"])
        except (ValueError, KeyError, TypeError):
            detail = e.body[:200]
        if "retry after" not in detail.lower():
            detail += f"; Retry-After {e.retry_after} s"
        stop = "its deadline would pass before the next attempt" if e.kind == "deadline" else "no retries left"
        self.args = (
            f"{e.method} {e.url}: refused for want of capacity, HTTP {e.status} on {e.attempts} attempt(s), {stop}: "
            f"{detail}",
        )


def _busy(e: HTTPUnavailable) -> HTTPUnavailable:
    """``e`` as ``ReasoningStateBusy`` when the API's last reply was a capacity refusal, else ``e`` itself."""
    if e.status in (429, 503) and e.retry_after is not None and e.kind in ("status", "deadline"):
        return ReasoningStateBusy(e)
    return e


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


def _settings(
    base_url: str, api_key: str | None, timeout: float, max_retries: int, backoff: float, n: int, deadline: float | None
):
    return HTTPSettings(base_url, api_key=api_key, timeout=timeout, max_retries=max_retries, backoff=backoff,
                        concurrency=n, deadline=deadline)  # fmt: skip


class ReasoningStateClient:
    """Blocking client: ``with ReasoningStateClient(url) as c: c.for_instance(inst)``. ``http``: the underlying
    ``httpx.Client`` (base URL and auth set) for other endpoints such as ``/metrics``. ``timeout`` is per attempt,
    ``max_retries`` the retries after the first, ``deadline`` (seconds, None: none) bounds one call in all."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 2,
        backoff: float = 0.5,
        max_connections: int = 16,
        deadline: float | None = None,
    ):
        settings = _settings(base_url, api_key, timeout, max_retries, backoff, max_connections, deadline)
        self.client = HTTPClient(settings)
        self.http = self.client.http
        self.http.headers[TIMEOUT_HEADER] = f"{min(timeout, deadline or timeout):g}"

    def reasoning_state(self, body: dict) -> ReasoningStateResponse:
        try:
            return self.client.request("POST", PATH, json=body, parse=_state)
        except HTTPRejected as e:
            raise _refused(e) from None
        except HTTPUnavailable as e:
            raise _busy(e) from None

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
    """Async client on one connection pool (``max_connections`` requests in flight); otherwise as
    ``ReasoningStateClient``."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_connections: int = 64,
        max_retries: int = 2,
        backoff: float = 0.5,
        deadline: float | None = None,
    ):
        settings = _settings(base_url, api_key, timeout, max_retries, backoff, max_connections, deadline)
        self.client = AsyncHTTPClient(settings)
        self.http = self.client.http
        self.http.headers[TIMEOUT_HEADER] = f"{min(timeout, deadline or timeout):g}"

    async def reasoning_state(self, body: dict) -> ReasoningStateResponse:
        try:
            return await self.client.request("POST", PATH, json=body, parse=_state)
        except HTTPRejected as e:
            raise _refused(e) from None
        except HTTPUnavailable as e:
            raise _busy(e) from None

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
