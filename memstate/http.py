"""The one HTTP layer of every memstate client (responder, judge, memory LLM, policy behind the API, the API's own
client): httpx, sync and async, bounded, retried.

``HTTPSettings`` say where and how: base URL, API key (sent as ``Authorization: Bearer``), timeout per attempt,
retries, backoff and concurrency. ``HTTPClient`` (blocking; safe to share between threads) and ``AsyncHTTPClient``
(one event loop) send with at most ``concurrency`` requests in flight, and retry

- transport errors and timeouts,
- 429 and 5xx replies, waiting what ``Retry-After`` asks (capped at ``max_delay``) when the server says,
- replies that are not a JSON object or that ``parse`` rejects (malformed replies, within the same budget),

with exponential backoff and full jitter (attempt ``k`` waits a uniform draw from ``[0, backoff · 2^(k-1)]``, at
most ``max_delay``). Any other 4xx is the request's own fault: ``HTTPRejected`` at once, never retried. After the
last attempt ``HTTPUnavailable`` (a ``ServerUnavailable``) names the URL, the attempts and every attempt's error.
``deadline`` bounds one call in all (waiting for a slot, every attempt and every wait between them): without it a
server that hangs holds a call for ``timeout · (max_retries + 1)`` plus the waits; with it the call gives up
(``HTTPUnavailable`` of kind ``deadline``) once the deadline has passed, or when the next wait would pass it.
``HTTPStats`` counts what happened; one object may be shared by several clients.

>>> settings = HTTPSettings("http://127.0.0.1:8000/", api_key="k", backoff=1.0, max_delay=3.0)
>>> settings.root, settings.headers()
('http://127.0.0.1:8000', {'Authorization': 'Bearer k'})
>>> retry_delay(settings, 5, "2", random.Random(0)), retry_delay(settings, 5, "600", random.Random(0))
(2.0, 3.0)
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

import httpx

from memstate.errors import MemstateError, ServerUnavailable

__all__ = [
    "AsyncHTTPClient",
    "HTTPClient",
    "HTTPRejected",
    "HTTPSettings",
    "HTTPStats",
    "HTTPUnavailable",
    "retry_delay",
]

# Indirection so tests can record the waits instead of sleeping them.
_sleep = time.sleep
_asleep = asyncio.sleep

_REPLY_ERRORS = (KeyError, IndexError, TypeError, ValueError)  # json.JSONDecodeError is a ValueError
# An idle connection is reused for at most this long: under uvicorn's 5 s keep-alive (vLLM's, the API's), so a client
# never sends on a connection the server is closing at that moment (the request then fails with a ReadError). httpx's
# default, 5 s, is the server's own: a loaded client whose event loop runs late hit it (bench_serve_load, issue 45).
KEEPALIVE_EXPIRY_S = 2.0


@dataclass(frozen=True)
class HTTPSettings:
    """Where a client sends and how it retries. ``max_retries`` counts retries (``max_retries + 1`` attempts);
    ``timeout`` is per attempt; ``backoff`` is the first retry's longest wait (doubling after), ``max_delay`` caps
    every wait, ``Retry-After`` included; ``concurrency`` bounds the requests in flight (and the connection pool);
    ``deadline`` (seconds, None: unbounded) bounds one call in all: the wait for a slot, every attempt, every wait.
    The async client enforces it exactly (the attempt in flight is cancelled); the sync one clips each attempt's
    timeout to the time left (httpx's timeouts are per read, so a server that trickles bytes can overrun it)."""

    base_url: str
    api_key: str | None = None
    timeout: float = 60.0
    max_retries: int = 3
    backoff: float = 0.5
    max_delay: float = 30.0
    concurrency: int = 16
    deadline: float | None = None

    def __post_init__(self) -> None:
        if self.deadline is not None and self.deadline <= 0:
            raise ValueError(f"deadline must be positive (or None), got {self.deadline}")

    @property
    def root(self) -> str:
        return self.base_url.rstrip("/")

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _client_options(self) -> dict[str, Any]:
        limits = httpx.Limits(
            max_connections=self.concurrency,
            max_keepalive_connections=self.concurrency,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        )
        return {"base_url": self.root, "headers": self.headers(), "timeout": self.timeout, "limits": limits}


@dataclass
class HTTPStats:
    """What the clients did: ``requests`` sent (retries included), ``retries``, how attempts failed (``timeouts``,
    ``server_errors`` — 429 and 5xx —, ``transport_errors``, ``bad_replies``), and calls that ended without a result
    (``gave_up``: the retry budget or the deadline spent, or a 4xx; ``rejected``: the 4xx among them). Thread-safe."""

    requests: int = 0
    retries: int = 0
    timeouts: int = 0
    server_errors: int = 0
    transport_errors: int = 0
    bad_replies: int = 0
    rejected: int = 0
    gave_up: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}


class HTTPUnavailable(ServerUnavailable):
    """No usable reply after every attempt. ``errors``: one line per attempt (a last line saying so when the deadline
    ended the call); ``kind`` of the last failure: ``timeout``, ``transport``, ``status`` (429/5xx; ``status`` and
    ``body`` say which), ``reply`` (malformed) or ``deadline`` (``HTTPSettings.deadline`` passed: during an attempt,
    or before a retry whose wait would pass it; ``status`` and ``body`` then those of the last reply, if any).
    ``retry_after``: the last reply's ``Retry-After`` header (None: it sent none)."""

    def __init__(
        self,
        method: str,
        url: str,
        errors: list[str],
        kind: str,
        status: int | None = None,
        body: str = "",
        *,
        attempts: int | None = None,
        deadline: float | str | None = None,
        retry_after: str | None = None,
    ):
        self.method, self.url, self.errors, self.kind, self.status, self.body = method, url, errors, kind, status, body
        self.retry_after, self.deadline = retry_after, deadline
        self.attempts, self.last = len(errors) if attempts is None else attempts, errors[-1] if errors else ""
        # The first ``attempts`` lines are the attempts' errors; a line after them says why no attempt followed.
        history = "; ".join(f"attempt {i}: {e}" if i <= self.attempts else e for i, e in enumerate(errors, 1))
        if kind == "deadline":
            limit = f"the {deadline:g} s deadline" if isinstance(deadline, (int, float)) else str(deadline)
            message = f"no usable reply within {limit} ({self.attempts} attempt(s): {history})"
        else:
            message = f"no usable reply after {self.attempts} attempt(s) ({history})"
        super().__init__(f"{method} {url}: {message}")


class HTTPRejected(MemstateError, RuntimeError):
    """A 4xx other than 429: the request itself is wrong, so it was not retried. ``text``: the reply body."""

    hint = "the server refused the request; its reply (in the message) says why"

    def __init__(self, method: str, url: str, status: int, text: str):
        self.method, self.url, self.status, self.text = method, url, status, text
        super().__init__(f"{method} {url}: HTTP {status}: {text[:300]}")


class _Retry(Exception):
    """One failed attempt that the budget may retry."""

    def __init__(self, kind: str, message: str, response: httpx.Response | None = None):
        super().__init__(message)
        self.kind, self.message, self.response = kind, message, response


def _retry_after(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delta-seconds or an HTTP date), None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def retry_delay(settings: HTTPSettings, attempt: int, retry_after: str | None, rng: random.Random) -> float:
    """The wait before retry number ``attempt`` (1-based): ``Retry-After`` when the server sent one, else full
    jitter over ``backoff · 2^(attempt-1)``; never more than ``max_delay``."""
    asked = _retry_after(retry_after)
    if asked is not None:
        return min(settings.max_delay, asked)
    return rng.uniform(0.0, min(settings.max_delay, settings.backoff * 2 ** (attempt - 1)))


def _last_reply(last: _Retry | None) -> dict[str, Any]:
    """``HTTPUnavailable``'s ``status``, ``body`` and ``retry_after`` from the reply of the failed attempt ``last``."""
    response = None if last is None else last.response
    if response is None:
        return {}
    text, retry_after = response.text[:300], response.headers.get("retry-after")
    return {"status": response.status_code, "body": text, "retry_after": retry_after}


class _Base:
    """What the sync and async clients share: settings, counters, and the judgement of one attempt."""

    def __init__(self, settings: HTTPSettings, stats: HTTPStats | None, seed: int | None):
        self.settings = settings
        self.stats = stats if stats is not None else HTTPStats()
        self._rng = random.Random(seed)
        # A time (time.monotonic) past which no call waits, whatever its own deadline: a reward round's budget
        # (OpenAIResponder.round_deadline); cutoff_name says which limit it is in errors.
        self.cutoff: float | None = None
        self.cutoff_name = "the cutoff"

    def url(self, path: str) -> str:
        return path if "://" in path else self.settings.root + path

    def _attempts(self, retry: bool) -> int:
        return self.settings.max_retries + 1 if retry else 1

    def _failed(self, e: httpx.TransportError) -> _Retry:
        if isinstance(e, httpx.TimeoutException):
            self.stats.count("timeouts")
            return _Retry("timeout", f"timeout after {self.settings.timeout} s ({type(e).__name__})")
        self.stats.count("transport_errors")
        return _Retry("transport", f"{type(e).__name__}: {e}")

    def _outcome(self, method: str, path: str, reply: httpx.Response, parse: Callable | None, raw: bool) -> Any:
        """The result of one attempt's reply; ``_Retry`` when it may be retried, ``HTTPRejected`` for a 4xx."""
        status = reply.status_code
        if status == 429 or status >= 500:
            self.stats.count("server_errors")
            raise _Retry("status", f"HTTP {status}: {reply.text[:200]}", reply)
        if raw:
            return reply
        if status >= 400:
            self.stats.count("rejected")
            self.stats.count("gave_up")
            raise HTTPRejected(method, self.url(path), status, reply.text[:2000])
        try:
            try:
                body = reply.json()
            except ValueError:
                raise ValueError(f"not JSON: {reply.text[:200]!r}") from None
            if not isinstance(body, dict):
                raise TypeError(f"expected a JSON object, got {type(body).__name__}")
            return parse(body) if parse else body
        except _REPLY_ERRORS as e:
            self.stats.count("bad_replies")
            text = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
            raise _Retry("reply", f"malformed reply: {text}") from None

    def _give_up(self, method: str, path: str, errors: list[str], last: _Retry) -> HTTPUnavailable:
        self.stats.count("gave_up")
        return HTTPUnavailable(method, self.url(path), errors, last.kind, **_last_reply(last))

    def _wait(self, attempt: int, last: _Retry) -> float:
        header = last.response.headers.get("retry-after") if last.response is not None else None
        return retry_delay(self.settings, attempt, header, self._rng)

    def _left(self, start: float) -> float | None:
        """Seconds left before the deadline of a call that began at ``start`` (``time.monotonic``), or before
        ``cutoff`` if that comes first; None: neither is set."""
        now, deadline = time.monotonic(), self.settings.deadline
        left = None if deadline is None else deadline - (now - start)
        if self.cutoff is not None:
            left = self.cutoff - now if left is None else min(left, self.cutoff - now)
        return left

    def _limit(self, start: float) -> float | str:
        """What ends a call that began at ``start``: the per-call deadline (seconds), or the cutoff's name."""
        deadline = self.settings.deadline
        if self.cutoff is not None and (deadline is None or self.cutoff < start + deadline):
            return self.cutoff_name
        return deadline

    def _limit_text(self, start: float) -> str:
        limit = self._limit(start)
        return f"the {limit:g} s deadline" if isinstance(limit, (int, float)) else limit

    def _past_deadline(
        self,
        method: str,
        path: str,
        errors: list[str],
        attempts: int,
        note: str,
        last: _Retry | None = None,
        start: float | None = None,
    ) -> HTTPUnavailable:
        self.stats.count("gave_up")
        deadline = self.settings.deadline if start is None else self._limit(start)
        return HTTPUnavailable(
            method, self.url(path), [*errors, note], "deadline", attempts=attempts, deadline=deadline,
            **_last_reply(last),
        )  # fmt: skip

    def _after_failure(
        self, method: str, path: str, errors: list[str], attempt: int, attempts: int, start: float, last: _Retry
    ) -> float:
        """After failed attempt ``attempt``: the wait before the next one, or the error that ends the call (the
        deadline has passed or would pass during the wait, or the attempts are spent)."""
        errors.append(last.message)
        left = self._left(start)
        if left is not None and left <= 0:
            note = f"{self._limit_text(start)} passed"
            raise self._past_deadline(method, path, errors, attempt, note, last, start) from None
        if attempt == attempts:
            raise self._give_up(method, path, errors, last) from None
        wait = self._wait(attempt, last)
        if left is not None and wait >= left:
            note = f"the next attempt would start after {self._limit_text(start)} (wait {wait:.2g} s)"
            raise self._past_deadline(method, path, errors, attempt, note, last, start) from None
        self.stats.count("retries")
        return wait


class HTTPClient(_Base):
    """Blocking client; share one between threads (at most ``concurrency`` requests in flight). ``http``: the
    underlying ``httpx.Client`` (base URL and auth set), for one-off calls outside the retry policy."""

    def __init__(
        self,
        settings: HTTPSettings,
        *,
        stats: HTTPStats | None = None,
        transport: httpx.BaseTransport | None = None,
        seed: int | None = None,
    ):
        super().__init__(settings, stats, seed)
        self.http = httpx.Client(transport=transport, **settings._client_options())
        self._slots = threading.BoundedSemaphore(settings.concurrency)

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        parse: Callable[[dict], Any] | None = None,
        retry: bool = True,
        timeout: float | None = None,
    ) -> Any:
        """The reply's JSON object, through ``parse`` when given (a ``KeyError``/``IndexError``/``TypeError``/
        ``ValueError`` from it makes a malformed reply, retried). ``HTTPRejected`` on a 4xx (not 429),
        ``HTTPUnavailable`` once the attempts are spent (``retry=False``: one attempt)."""
        return self._loop(method, path, json, parse, retry, timeout, raw=False)

    def send(
        self, method: str, path: str, *, json: Any = None, retry: bool = True, timeout: float | None = None
    ) -> httpx.Response:
        """The reply itself, whatever its status below 500 (429 excepted): transport errors, timeouts, 429 and 5xx
        are retried as in ``request``."""
        return self._loop(method, path, json, None, retry, timeout, raw=True)

    def _loop(self, method, path, json, parse, retry, timeout, *, raw):
        start, errors = time.monotonic(), []
        attempts = self._attempts(retry)
        for attempt in range(1, attempts + 1):
            left = self._left(start)
            if not self._slots.acquire(timeout=None if left is None else max(left, 0.0)):
                note = f"no free connection slot within {self._limit_text(start)}"
                raise self._past_deadline(method, path, errors, attempt - 1, note, start=start)
            try:
                try:
                    self.stats.count("requests")
                    left = self._left(start)  # the attempt's timeout, clipped to the time the deadline leaves
                    per_attempt = self.settings.timeout if timeout is None else timeout
                    options = {} if timeout is None and left is None else {
                        "timeout": per_attempt if left is None else max(min(per_attempt, left), 0.001)
                    }  # fmt: skip
                    try:
                        reply = self.http.request(method, path, json=json, **options)
                    except httpx.TransportError as e:
                        raise self._failed(e) from None
                finally:
                    self._slots.release()
                return self._outcome(method, path, reply, parse, raw)
            except _Retry as last:
                _sleep(self._after_failure(method, path, errors, attempt, attempts, start, last))
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> HTTPClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncHTTPClient(_Base):
    """The async twin of ``HTTPClient``, for one event loop (create and use it on the same loop)."""

    def __init__(
        self,
        settings: HTTPSettings,
        *,
        stats: HTTPStats | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        seed: int | None = None,
    ):
        super().__init__(settings, stats, seed)
        self.http = httpx.AsyncClient(transport=transport, **settings._client_options())
        self._slots = asyncio.Semaphore(settings.concurrency)

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        parse: Callable[[dict], Any] | None = None,
        retry: bool = True,
        timeout: float | None = None,
    ) -> Any:
        """As ``HTTPClient.request``."""
        return await self._loop(method, path, json, parse, retry, timeout, raw=False)

    async def send(
        self, method: str, path: str, *, json: Any = None, retry: bool = True, timeout: float | None = None
    ) -> httpx.Response:
        """As ``HTTPClient.send``."""
        return await self._loop(method, path, json, None, retry, timeout, raw=True)

    async def _loop(self, method, path, json, parse, retry, timeout, *, raw):
        options = {} if timeout is None else {"timeout": timeout}
        start, errors = time.monotonic(), []
        attempts = self._attempts(retry)
        for attempt in range(1, attempts + 1):
            sent = False
            try:
                try:
                    async with asyncio.timeout(self._left(start)):  # None: no deadline
                        async with self._slots:
                            self.stats.count("requests")
                            sent = True
                            try:
                                reply = await self.http.request(method, path, json=json, **options)
                            except httpx.TransportError as e:
                                raise self._failed(e) from None
                except TimeoutError:  # asyncio.timeout's: the deadline passed (httpx's timeouts are no TimeoutError)
                    limit = self._limit_text(start)
                    note = f"cut off by {limit}" if sent else f"no free connection slot within {limit}"
                    raise self._past_deadline(method, path, errors, attempt if sent else attempt - 1, note,
                                              start=start) from None  # fmt: skip
                return self._outcome(method, path, reply, parse, raw)
            except _Retry as last:
                await _asleep(self._after_failure(method, path, errors, attempt, attempts, start, last))
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncHTTPClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
