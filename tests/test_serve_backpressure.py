"""Backpressure in the reasoning-state API: a bounded queue, deadlines in it, and clients that honour Retry-After.

The API runs under a real uvicorn (``live_app``) in front of a real local policy server (``ChatServer``) whose chat
replies wait on a gate the test opens, so "the policy is busy" is a state the test controls, not a timing. Requests
are sent from threads; the test waits on the API's own gauges (requests at work, requests queued) before it acts.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from chat_server import ChatServer, live_app
from prometheus_client.parser import text_string_to_metric_families
from test_serve_api import GOOD, INSTANCE, payload

import memstate.http
from memstate.errors import ServerUnavailable
from memstate.serve.admission import Admission, Refused
from memstate.serve.api import ApiConfig, create_app
from memstate.serve.client import AsyncReasoningStateClient, ReasoningStateBusy, ReasoningStateClient

PATH = "/v1/reasoning-state"


class GatedPolicy:
    """Chat replies (a well-formed state) wait until ``gate`` is set; leaving ``with policy`` sets it, so a failed
    test does not leave the servers waiting."""

    def __init__(self):
        self.gate = threading.Event()

    def __enter__(self) -> GatedPolicy:
        return self

    def __exit__(self, *exc) -> None:
        self.gate.set()

    def __call__(self, body: dict) -> tuple[int, str]:
        assert self.gate.wait(30), "the test never opened the gate"
        return 200, GOOD


def metrics(url: str) -> dict[tuple, float]:
    """The API's samples: ``(name, label values...)`` -> value."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return {
        (s.name, *s.labels.values()): s.value for family in text_string_to_metric_families(text) for s in family.samples
    }


def wait_for(condition, what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def load(url: str) -> tuple[float, float]:
    """(requests at work, requests queued) by the API's gauges."""
    m = metrics(url)
    return m[("memstate_api_in_flight",)], m[("memstate_api_queue_depth",)]


def api(policy_url: str, **overrides):
    return live_app(create_app(ApiConfig(policy_url=policy_url, auth="none", **overrides)))


def test_a_full_queue_sheds_with_429_and_retry_after_and_the_queued_complete():
    policy = GatedPolicy()
    with ChatServer(policy) as server, api(server.url, max_concurrency=2, max_queue=2) as url, policy:
        with ThreadPoolExecutor(4) as pool:
            admitted = [pool.submit(httpx.post, url + PATH, json=payload(), timeout=30) for _ in range(4)]
            # a slot is counted when admitted, a moment before its request reaches the policy: wait for both
            wait_for(lambda: load(url) == (2, 2) and len(server.requests) == 2, "2 requests at the policy and 2 queued")
            assert len(server.requests) == 2 and load(url) == (2, 2)  # the queued two have not reached the policy
            refused = httpx.post(url + PATH, json=payload(), timeout=10)
            during = metrics(url)
            policy.gate.set()
            replies = [f.result() for f in admitted]
        after = metrics(url)
    assert refused.status_code == 429, refused.text
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    body = refused.json()
    assert set(body) == {"detail", "request_id"} and "at capacity" in body["detail"] and "2 queued" in body["detail"]
    assert during[("memstate_api_shed_total", "queue_full")] == 1
    assert during[("memstate_api_requests_total", PATH, "429")] == 1
    assert [r.status_code for r in replies] == [200] * 4 and all(r.json()["format_ok"] for r in replies)
    assert len(server.requests) == 4  # each admitted request reached the policy once, the refused one never
    assert after[("memstate_api_requests_total", PATH, "200")] == 4
    assert after[("memstate_api_queue_seconds_count",)] == 4  # the admitted ones' waits, the 2 queued included
    assert (after[("memstate_api_in_flight",)], after[("memstate_api_queue_depth",)]) == (0, 0)


@pytest.mark.parametrize(
    ("config", "headers", "source"),
    [
        ({"queue_timeout_s": 0.3}, {}, "(queue_timeout_s)"),
        ({"queue_timeout_s": 30}, {"X-Request-Timeout": "0.3"}, "(the request's X-Request-Timeout)"),
    ],
)
def test_a_request_whose_deadline_passes_in_the_queue_gets_503_and_is_never_worked_on(config, headers, source):
    policy = GatedPolicy()
    with ChatServer(policy) as server, api(server.url, max_concurrency=1, max_queue=4, **config) as url, policy:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(httpx.post, url + PATH, json=payload(), timeout=30)
            wait_for(lambda: load(url) == (1, 0), "1 request at work")
            late = httpx.post(url + PATH, json=payload(), headers=headers, timeout=20)
            bad_header = httpx.post(url + PATH, json=payload(), headers={"X-Request-Timeout": "-1"}, timeout=20)
            policy.gate.set()
            assert first.result().status_code == 200
        m = metrics(url)
    assert late.status_code == 503, late.text
    assert 1 <= int(late.headers["retry-after"]) <= 60
    assert late.json()["detail"].startswith("no free slot within 0.3 s " + source)
    assert bad_header.status_code == 422 and "x-request-timeout" in bad_header.json()["detail"]
    assert len(server.requests) == 1  # the late request never reached the policy
    assert m[("memstate_api_shed_total", "deadline")] == 1
    assert not any(k[0] == "memstate_api_requests_total" and k[2] == "500" for k in m)
    assert (m[("memstate_api_in_flight",)], m[("memstate_api_queue_depth",)]) == (0, 0)


def test_a_request_that_would_wait_too_long_is_refused_at_once_before_its_body_is_read(monkeypatch):
    monkeypatch.setenv("MEMSTATE_API_KEY", "k")
    auth = {"Authorization": "Bearer k"}
    policy = GatedPolicy()
    with ChatServer(policy) as server:
        app = create_app(ApiConfig(policy_url=server.url, max_concurrency=1, max_queue=4, max_queue_wait_s=5.0,
                                   public_metrics=True))  # fmt: skip
        app.state.admission.observe(3.0)  # history: a request holds its slot 3 s, so the next would wait ~3 s
        with live_app(app) as url, policy, ThreadPoolExecutor(1) as pool:
            first = pool.submit(httpx.post, url + PATH, json=payload(), headers=auth, timeout=30)
            wait_for(lambda: load(url) == (1, 0), "1 request at work")
            hurried = {**auth, "X-Request-Timeout": "2"}
            short = httpx.post(url + PATH, json=payload(), headers=hurried, timeout=10)
            garbage = httpx.post(url + PATH, content=b"{not json", headers=hurried, timeout=10)
            anonymous = httpx.post(url + PATH, json=payload(), headers={"X-Request-Timeout": "2"}, timeout=10)
            bad_header = httpx.post(url + PATH, json=payload(), headers={**auth, "X-Request-Timeout": "-1"}, timeout=10)
            app.state.admission.max_wait_s = 2.0
            capped = httpx.post(url + PATH, json=payload(), headers=auth, timeout=10)
            policy.gate.set()
            assert first.result().status_code == 200
            m = metrics(url)
    for reply, source in ((short, "the request's X-Request-Timeout"), (capped, "max_queue_wait_s")):
        assert reply.status_code == 429 and reply.headers["retry-after"] == "3", reply.text
        assert reply.json()["detail"] == (
            f"the API is at capacity (1 at work, 0 queued, a slot would take about 3.0 s, more than the 2 s ({source}) "
            "a request may wait); retry after 3 s"
        )
    assert garbage.status_code == 429  # refused before its body was read: no 400 for a body nobody parsed
    assert anonymous.status_code == 401 and bad_header.status_code == 422  # what is wrong with a request stays said
    assert len(server.requests) == 1  # only the first reached the policy
    assert m[("memstate_api_shed_total", "predicted_wait")] == 3
    assert m[("memstate_api_requests_total", PATH, "429")] == 3 and m[("memstate_api_requests_total", PATH, "200")] == 1


def test_the_client_waits_what_retry_after_asks_and_succeeds_once_capacity_frees(monkeypatch):
    policy = GatedPolicy()
    waits = []
    with ChatServer(policy) as server, api(server.url, max_concurrency=1, max_queue=0) as url, policy:

        def wait(seconds: float) -> None:  # capacity frees while the client waits: the retry must then succeed
            waits.append(seconds)
            policy.gate.set()
            wait_for(lambda: load(url) == (0, 0), "the first request to finish")

        monkeypatch.setattr(memstate.http, "_sleep", wait)
        with ThreadPoolExecutor(1) as pool, ReasoningStateClient(url, max_retries=2, backoff=0.001) as client:
            first = pool.submit(httpx.post, url + PATH, json=payload(), timeout=30)
            wait_for(lambda: load(url) == (1, 0), "1 request at work")
            state = client.for_instance(INSTANCE)
            assert first.result().status_code == 200
            assert client.http.headers["X-Request-Timeout"] == "120"
            stats = client.client.stats
        m = metrics(url)
    assert state.format_ok and len(state.rules) == 2
    assert waits == [1.0]  # Retry-After (1 s: one at work, no history), not the 0.001 s backoff's jitter
    assert stats.retries == 1 and stats.server_errors == 1
    assert m[("memstate_api_shed_total", "queue_full")] == 1
    assert m[("memstate_api_requests_total", PATH, "429")] == 1 and m[("memstate_api_requests_total", PATH, "200")] == 2


def test_the_clients_give_up_with_one_clear_line(monkeypatch):
    policy = GatedPolicy()
    waits = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(memstate.http, "_asleep", record)

    async def ask(url: str) -> None:
        async with AsyncReasoningStateClient(url, max_retries=2, backoff=0.001) as client:
            await client.for_instance(INSTANCE)

    with ChatServer(policy) as server, api(server.url, max_concurrency=1, max_queue=0) as url, policy:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(httpx.post, url + PATH, json=payload(), timeout=30)
            wait_for(lambda: load(url) == (1, 0), "1 request at work")
            with pytest.raises(ReasoningStateBusy) as busy:
                asyncio.run(ask(url))
            with ReasoningStateClient(url, deadline=0.5) as client, pytest.raises(ReasoningStateBusy) as hurried:
                client.for_instance(INSTANCE)  # Retry-After 1 s would pass its 0.5 s deadline: no second attempt
            policy.gate.set()
            assert first.result().status_code == 200
        m = metrics(url)
    e = busy.value
    assert isinstance(e, ServerUnavailable) and e.status == 429 and e.attempts == 3 and waits == [1.0, 1.0]
    message = str(e)
    assert "\n" not in message and len(message) < 400, message
    assert message == (
        f"POST {url}{PATH}: refused for want of capacity, HTTP 429 on 3 attempt(s), no retries left: the API is at "
        "capacity (1 at work, 0 queued, at most 0 may wait); retry after 1 s"
    )
    assert "overloaded" in e.hint
    h = hurried.value
    assert h.attempts == 1 and "its deadline would pass before the next attempt" in str(h)
    assert m[("memstate_api_shed_total", "queue_full")] == 4


def test_a_policy_that_is_down_is_not_reported_as_busy():
    # 503 without Retry-After (the policy unreachable) stays the plain HTTPUnavailable: it is down, not overloaded.
    from memstate.serve.policy import free_port

    with api(f"http://127.0.0.1:{free_port()}", timeout_s=5) as url:
        with ReasoningStateClient(url, max_retries=0) as client, pytest.raises(ServerUnavailable) as down:
            client.for_instance(INSTANCE)
    assert not isinstance(down.value, ReasoningStateBusy) and down.value.status == 503


def test_admission_is_first_come_first_served_and_frees_what_it_takes():
    async def scenario() -> tuple[list, list]:
        admission = Admission(limit=1, queue=2)
        order, refusals = [], []
        release = asyncio.Event()

        async def request(name: str, budget: float) -> None:
            try:
                async with admission.slot(budget):
                    order.append(name)
                    if name == "a":
                        await release.wait()
            except Refused as e:
                refusals.append((name, e.reason, e.retry_after))

        first = asyncio.create_task(request("a", 5))
        await asyncio.sleep(0)
        queued = [asyncio.create_task(request(n, 5)) for n in ("b", "c")]
        late = asyncio.create_task(request("late", 0.05))  # the queue is full: refused at once
        await asyncio.sleep(0.01)
        assert (admission.active, admission.waiting) == (1, 2)
        await late
        cancelled = queued[0]
        cancelled.cancel()  # its client went away: its place is freed, nobody is handed a slot twice
        await asyncio.sleep(0)
        assert (admission.active, admission.waiting) == (1, 1)
        expiring = asyncio.create_task(request("d", 0.05))
        await expiring
        release.set()
        await asyncio.gather(first, queued[1], return_exceptions=True)
        assert (admission.active, admission.waiting) == (0, 0)
        return order, refusals

    order, refusals = asyncio.run(scenario())
    assert order == ["a", "c"]
    # Retry-After with no history (S = 1 s): 1 at work + 2 queued over 1 slot; then 1 at work + 1 queued.
    assert refusals == [("late", "queue_full", 3), ("d", "deadline", 2)]


def test_admission_queues_only_requests_it_predicts_it_can_serve_in_time():
    async def scenario() -> tuple[list, int]:
        admission = Admission(limit=1, queue=4, max_wait_s=2.0)
        refusals = []

        async def request(budget: float) -> None:
            try:
                async with admission.slot(budget, " (budget)"):
                    pass
            except Refused as e:
                refusals.append((e.reason, e.detail))

        async with admission.slot(30):  # no history yet: nothing predicted, the next one may queue
            queued = asyncio.create_task(request(30))
            await asyncio.sleep(0)
            assert admission.waiting == 1
            admission.observe(1.5)  # S = 1.5 s (taking over the no-history start): the next would wait ~3 s
            await request(30)  # over max_wait_s
            admission.max_wait_s = None
            await request(2.5)  # over its own budget
            fits = asyncio.create_task(request(30))  # queued behind the first
            await asyncio.sleep(0)
            waiting = admission.waiting
        await asyncio.gather(queued, fits)
        return refusals, waiting

    refusals, waiting = asyncio.run(scenario())
    assert [reason for reason, _ in refusals] == ["predicted_wait"] * 2 and waiting == 2
    assert "about 3.0 s, more than the 2 s (max_queue_wait_s)" in refusals[0][1]
    assert "about 3.0 s, more than the 2.5 s (budget)" in refusals[1][1]


def test_memory_ask_says_in_one_line_that_the_api_is_at_capacity(tiny_models, tmp_path, capsys, monkeypatch):
    import json
    import shutil

    from shipped_data import MEMSYCO

    from memstate.cli import main

    rows = tmp_path / "row.jsonl"
    line = (MEMSYCO / "valid_memory_selection.jsonl").read_text(encoding="utf-8").splitlines()[0]
    rows.write_text(line + "\n", encoding="utf-8")
    shutil.copy(MEMSYCO / "schema.json", tmp_path / "schema.json")
    store = tmp_path / "user.sqlite"
    assert main(["memory", "ingest", "--store", str(store), "--format", "memsyco", str(rows)]) == 0
    capsys.readouterr()
    monkeypatch.setattr(memstate.http, "_sleep", lambda seconds: None)
    policy = GatedPolicy()
    with ChatServer(policy) as server, api(server.url, max_concurrency=1, max_queue=0) as url, policy:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(httpx.post, url + PATH, json=payload(), timeout=30)
            wait_for(lambda: load(url) == (1, 0), "1 request at work")
            argv = ["memory", "ask", "--store", str(store), json.loads(line)["question"], "--responder",
                    str(tiny_models["responder"]), "--api-url", url]  # fmt: skip
            code = main(argv)
            policy.gate.set()
            assert first.result().status_code == 200
    last = capsys.readouterr().err.splitlines()[-1]  # after the responder's loading bar
    assert code == 2 and last.startswith(f"memstate memory ask: error: POST {url}{PATH}: refused for want of capacity")
    assert "HTTP 429 on 3 attempt(s), no retries left: the API is at capacity (1 at work, 0 queued" in last
    assert last.endswith("(hint: the API is overloaded; retry later, or raise the API's max_concurrency/max_queue or "
                         "the client's retries)")  # fmt: skip
