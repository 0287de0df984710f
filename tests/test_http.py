"""memstate.http, the HTTP layer of every client, against a real local HTTP server (a thread) that answers a
script: retries, Retry-After, 4xx, giving up, an unreachable port, auth, the concurrency bound; sync and async.
Waits are recorded instead of slept (``memstate.http._sleep``), so no test asserts timings."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import memstate.http as layer
from memstate.errors import ServerUnavailable
from memstate.http import (
    AsyncHTTPClient,
    HTTPClient,
    HTTPRejected,
    HTTPSettings,
    HTTPStats,
    HTTPUnavailable,
    retry_delay,
)


class ScriptServer:
    """Answers every request with the next scripted reply (the last one repeats): ``(status, body)`` or
    ``(status, body, headers)`` or ``(status, body, headers, hold_s)``; a dict body is sent as JSON. Records each
    request's path and Authorization header, and the most requests it held at once."""

    def __init__(self, *script):
        self.script = list(script) or [(200, {"ok": True})]
        self.requests: list[dict] = []
        self.in_flight = self.peak = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server._serve(self)

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                server._serve(self)

        class Server(ThreadingHTTPServer):
            request_queue_size = 64

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        with self.lock:
            n = len(self.requests)
            self.requests.append({"path": handler.path, "auth": handler.headers.get("Authorization")})
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        status, body, headers, hold = (*self.script[min(n, len(self.script) - 1)], {}, 0.0)[:4]
        try:
            if hold:
                time.sleep(hold)
        finally:
            # Before the reply is written: once the client reads it, it may send its next request at once, and a
            # handler thread descheduled between writing and counting down (a loaded machine) would count 4 held
            # requests under a bound of 3.
            with self.lock:
                self.in_flight -= 1
        try:
            data = json.dumps(body).encode() if isinstance(body, dict) else str(body).encode()
            handler.send_response(status)
            for k, v in {"Content-Type": "application/json", **headers}.items():
                handler.send_header(k, v)
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def __enter__(self) -> ScriptServer:
        threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def waits(monkeypatch) -> list[float]:
    """The waits between attempts, recorded instead of slept (sync and async)."""
    recorded: list[float] = []

    async def asleep(seconds: float) -> None:
        recorded.append(seconds)

    monkeypatch.setattr(layer, "_sleep", recorded.append)
    monkeypatch.setattr(layer, "_asleep", asleep)
    return recorded


def settings(url: str, **kw) -> HTTPSettings:
    return HTTPSettings(url, **{"timeout": 5.0, "max_retries": 3, "backoff": 0.001} | kw)


def free_port() -> int:
    with socket.socket() as s:  # nothing listens on it once closed
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- sync ------------------------------------------------------------------------------------------------------


def test_retries_5xx_then_succeeds(waits):
    with ScriptServer((503, "busy"), (502, "bad gateway"), (200, {"answer": 42})) as server:
        with HTTPClient(settings(server.url)) as client:
            assert client.request("POST", "/v1/x", json={"q": 1}, parse=lambda b: b["answer"]) == 42
    assert len(server.requests) == 3 and len(waits) == 2
    s = client.stats
    assert (s.requests, s.retries, s.server_errors, s.gave_up, s.rejected) == (3, 2, 2, 0, 0)


def test_retry_after_is_honoured_and_capped(waits):
    script = [(429, "slow down", {"Retry-After": "7"}), (503, "later", {"Retry-After": "600"}), (200, {})]
    with ScriptServer(*script) as server, HTTPClient(settings(server.url, max_delay=20.0)) as client:
        assert client.request("GET", "/v1/models") == {}
    assert waits == [7.0, 20.0]


def test_backoff_is_exponential_with_full_jitter(waits):
    with ScriptServer((500, "down")) as server, HTTPClient(settings(server.url, backoff=1.0, max_delay=3.0)) as c:
        with pytest.raises(HTTPUnavailable):
            c.request("GET", "/")
    assert len(waits) == 3
    assert all(0.0 <= w <= ceiling for w, ceiling in zip(waits, [1.0, 2.0, 3.0], strict=True))
    rng = random.Random(0)
    draws = [retry_delay(HTTPSettings("u", backoff=1.0, max_delay=3.0), 3, None, rng) for _ in range(200)]
    assert max(draws) <= 3.0 and min(draws) < 0.5  # full jitter: uniform over [0, min(cap, 4)]
    date = "Wed, 21 Oct 2015 07:28:00 GMT"  # an HTTP date in the past: retry at once
    assert retry_delay(HTTPSettings("u"), 1, date, rng) == 0.0


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_other_4xx_are_not_retried(waits, status):
    with ScriptServer((status, {"detail": "your fault"})) as server, HTTPClient(settings(server.url)) as client:
        with pytest.raises(HTTPRejected) as refused:
            client.request("POST", "/v1/x", json={})
        assert client.send("POST", "/v1/x").status_code == status  # send() hands the reply back as it is
    assert len(server.requests) == 2 and waits == []
    e = refused.value
    assert e.status == status and "your fault" in e.text and f"{server.url}/v1/x" in str(e)
    assert client.stats.rejected == 1 and client.stats.retries == 0


def test_gives_up_after_the_attempts_naming_url_attempts_and_errors(waits):
    with ScriptServer((500, "engine died")) as server, HTTPClient(settings(server.url, max_retries=2)) as client:
        with pytest.raises(ServerUnavailable) as gave_up:
            client.request("POST", "/v1/chat/completions", json={})
    assert len(server.requests) == 3 and len(waits) == 2
    e = gave_up.value
    assert isinstance(e, HTTPUnavailable)
    assert f"POST {server.url}/v1/chat/completions" in str(e) and "3 attempt(s)" in str(e)
    assert "attempt 3: HTTP 500: engine died" in str(e)
    assert (e.attempts, e.kind, e.status, e.body, e.last) == (3, "status", 500, "engine died", "HTTP 500: engine died")
    assert client.stats.gave_up == 1 and client.stats.server_errors == 3


def test_unreachable_port(waits):
    port = free_port()
    with HTTPClient(settings(f"http://127.0.0.1:{port}", max_retries=1)) as client:
        with pytest.raises(HTTPUnavailable) as gave_up:
            client.request("GET", "/health")
        assert client.stats.transport_errors == 2
    e = gave_up.value
    assert e.kind == "transport" and e.status is None and f"127.0.0.1:{port}/health" in str(e) and "Connect" in e.last


def test_malformed_replies_are_retried_in_the_same_budget(waits):
    script = [(200, "<html>proxy</html>"), (200, {"choices": []}), (200, {"choices": [{"text": "ok"}]})]
    with ScriptServer(*script) as server, HTTPClient(settings(server.url)) as client:
        assert client.request("POST", "/v1/c", parse=lambda b: b["choices"][0]["text"]) == "ok"
        assert client.stats.bad_replies == 2 and client.stats.retries == 2
    with ScriptServer((200, "[1, 2]")) as server, HTTPClient(settings(server.url, max_retries=1)) as client:
        with pytest.raises(HTTPUnavailable, match="expected a JSON object") as gave_up:
            client.request("GET", "/")
    assert gave_up.value.kind == "reply"


def test_timeouts_are_retried_then_reported(waits):
    with ScriptServer((200, {}, {}, 1.0)) as server, HTTPClient(settings(server.url, timeout=0.2, max_retries=1)) as c:
        with pytest.raises(HTTPUnavailable, match="timeout after 0.2 s") as gave_up:
            c.request("GET", "/slow")
    assert gave_up.value.kind == "timeout" and c.stats.timeouts == 2


def test_retry_false_is_one_attempt(waits):
    with ScriptServer((503, "down")) as server, HTTPClient(settings(server.url)) as client:
        with pytest.raises(HTTPUnavailable):
            client.send("GET", "/health", retry=False)
    assert len(server.requests) == 1 and waits == []


def test_api_key_is_sent_as_bearer_token():
    with ScriptServer() as server:
        with HTTPClient(settings(server.url, api_key="s3cret")) as client:
            client.request("GET", "/a")
        with HTTPClient(settings(server.url)) as client:
            client.request("GET", "/b")
    assert [r["auth"] for r in server.requests] == ["Bearer s3cret", None]


def test_concurrency_bound_across_threads():
    with ScriptServer((200, {}, {}, 0.15)) as server, HTTPClient(settings(server.url, concurrency=3)) as client:
        with ThreadPoolExecutor(12) as pool:
            list(pool.map(lambda i: client.request("GET", f"/{i}"), range(12)))
    assert len(server.requests) == 12 and 1 < server.peak <= 3


def test_stats_can_be_shared():
    stats = HTTPStats()
    with ScriptServer() as server:
        for _ in range(2):
            with HTTPClient(settings(server.url), stats=stats) as client:
                client.request("GET", "/")
    assert stats.as_dict() == {
        "requests": 2, "retries": 0, "timeouts": 0, "server_errors": 0, "transport_errors": 0, "bad_replies": 0,
        "rejected": 0, "gave_up": 0,
    }  # fmt: skip


# ---- async -----------------------------------------------------------------------------------------------------


def test_async_retries_then_succeeds_and_gives_up(waits):
    async def run(url: str):
        async with AsyncHTTPClient(settings(url, api_key="k")) as client:
            first = await client.request("POST", "/v1/x", json={}, parse=lambda b: b["n"])
            with pytest.raises(HTTPRejected):
                await client.request("POST", "/v1/x", json={})
            return first, client.stats

    with ScriptServer((503, "busy", {"Retry-After": "2"}), (200, {"n": 1}), (404, "no")) as server:
        first, stats = asyncio.run(run(server.url))
    assert first == 1 and waits == [2.0] and stats.retries == 1 and stats.rejected == 1
    assert [r["auth"] for r in server.requests] == ["Bearer k"] * 3

    async def down(url: str):
        async with AsyncHTTPClient(settings(url, max_retries=2)) as client:
            await client.request("GET", "/v1/models")

    with ScriptServer((500, "no")) as server, pytest.raises(HTTPUnavailable, match="3 attempt") as gave_up:
        asyncio.run(down(server.url))
    assert len(server.requests) == 3 and gave_up.value.url == f"{server.url}/v1/models"
    with pytest.raises(HTTPUnavailable) as gave_up:
        asyncio.run(down(f"http://127.0.0.1:{free_port()}"))
    assert gave_up.value.kind == "transport"


def test_async_concurrency_bound():
    async def run(url: str) -> None:
        async with AsyncHTTPClient(settings(url, concurrency=4)) as client:
            await asyncio.gather(*(client.request("GET", f"/{i}") for i in range(16)))

    with ScriptServer((200, {}, {}, 0.15)) as server:
        asyncio.run(run(server.url))
    assert len(server.requests) == 16 and 1 < server.peak <= 4


def test_async_send_and_per_request_timeout(waits):
    async def run(url: str):
        async with AsyncHTTPClient(settings(url)) as client:
            reply = await client.send("GET", "/health", retry=False, timeout=2.0)
            return reply.status_code

    with ScriptServer((204, "")) as server:
        assert asyncio.run(run(server.url)) == 204
