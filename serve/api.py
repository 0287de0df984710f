"""``memstate serve api``: the reasoning-state HTTP service the memory pipeline calls (FastAPI).

``POST /v1/reasoning-state`` takes a request and its retrieved memories in docs/design.md's shapes, builds the policy
prompt exactly as training did (``memstate.prompts``; facts truncated to the prompt budget when a tokenizer is
configured), asks the served policy (vLLM's OpenAI-compatible chat endpoint), and validates the answer with the same
``parse_completion`` as the reward (a reply cut off at ``max_tokens`` is no state). A reply that fails the format is
asked for once more (``format_retries``); if it
still fails, the answer is 200 with ``format_ok: false`` and no rules, so the caller can answer without a state.

Status codes: 400 malformed JSON; 401 missing/wrong bearer token (only when a key is configured); 413 body over
``max_body_bytes``; 422 a field missing, mistyped or over a limit, or a relation naming an unknown fact; 429 the API
is at capacity (``max_concurrency`` requests at work and ``max_queue`` waiting, or a predicted wait for a slot longer
than ``max_queue_wait_s`` or the request's deadline), with ``Retry-After``, decided before the body is read; 502 the
policy answered with an error or garbage; 503 the policy is unreachable, or (with ``Retry-After``) the request waited
in the queue past its deadline (``queue_timeout_s``, or the request's ``X-Request-Timeout`` header when shorter); 504
the policy did not answer within ``timeout_s``. ``GET /healthz`` (is the policy reachable?) and ``GET /metrics``
(Prometheus) need no token. Admission and the ``Retry-After`` rule: ``serve/admission.py``.
"""

# No `from __future__ import annotations`: FastAPI resolves the dependency annotations of the closures in
# create_app at runtime, and string annotations would point at names local to create_app.
import asyncio
import hmac
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass, field
from typing import Annotated

import httpx
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel

from memstate.chat import CHAT_COMPLETIONS, ChatReply, achat, chat_request
from memstate.checkpoint import CheckpointMetadata
from memstate.http import AsyncHTTPClient, HTTPRejected, HTTPSettings, HTTPUnavailable
from memstate.leak import leak_reason
from memstate.prompts import DEFAULT_MAX_PROMPT_TOKENS, PROMPT_VERSION, fit_policy_prompt, policy_request_messages
from memstate.rules import FormatError, parse_completion
from memstate.schema import Fact, Relation
from memstate.serve.admission import Admission, Refused
from memstate.serve.client import PATH
from memstate.serve.shapes import ReasoningStateRequest, ReasoningStateResponse

logger = logging.getLogger("memstate.serve")


@dataclass
class ApiConfig:
    """The reasoning-state API (``configs/serve/api.yaml``; every field is also a ``--flag``)."""

    policy_url: str = field(
        default="http://127.0.0.1:8000", metadata={"help": "Base URL of the policy's vLLM server (no /v1)."}
    )
    policy_model: str | None = field(
        default=None, metadata={"help": "Served model name; default: the first model the server lists."}
    )
    tokenizer: str | None = field(
        default=None,
        metadata={"help": "The checkpoint (or its tokenizer): facts are then truncated to max_prompt_tokens exactly "
                  "as in training. Without it prompts are sent whole and an over-long one is a 422."},
    )  # fmt: skip
    max_prompt_tokens: int | None = field(
        default=None,
        metadata={"help": "Policy prompt budget; default: the checkpoint's (its memstate.json, when --tokenizer is a "
                  "trained checkpoint), else 8192."},
    )  # fmt: skip
    temperature: float = field(default=0.3, metadata={"help": "Sampling temperature of the policy."})
    max_tokens: int = field(default=512, metadata={"help": "Most tokens the policy may write (a state is ≤ 80 words)."})
    format_retries: int = field(default=1, metadata={"help": "Extra policy calls when a reply fails the format."})
    timeout_s: float = field(default=60.0, metadata={"help": "Per policy call; past it the request gets 504."})
    policy_retries: int = field(
        default=0,
        metadata={"help": "Retries of a policy call on transport errors, timeouts, 429/5xx and garbage replies "
                  "(backoff with jitter). Default none: the caller's client retries the 502/503/504 instead."},
    )  # fmt: skip
    policy_backoff_s: float = field(default=0.2, metadata={"help": "First policy retry's longest wait (doubles)."})
    max_concurrency: int = field(
        default=64,
        metadata={"help": "Requests at work (each makes its policy calls one after another, so also the policy calls "
                  "in flight); more wait in the queue."},
    )  # fmt: skip
    max_queue: int | None = field(
        default=None,
        metadata={"help": "Requests that may wait for a slot; more are refused at once with 429 and Retry-After. "
                  "Default: max_concurrency (an admitted request then waits about one request's time at most); "
                  "0: no waiting."},
    )  # fmt: skip
    max_queue_wait_s: float | None = field(
        default=1.0,
        metadata={"help": "Longest predicted wait for a slot a request is queued for, (queued + 1) × the recent "
                  "time a request holds its slot / max_concurrency; a longer one is refused at once with 429 and "
                  "Retry-After (as is one longer than the request's own deadline). null: only the deadline."},
    )  # fmt: skip
    queue_timeout_s: float = field(
        default=30.0,
        metadata={"help": "Longest wait for a slot (the request's X-Request-Timeout header, in seconds, when "
                  "shorter); a request still queued then gets 503 and Retry-After, and is never worked on."},
    )  # fmt: skip
    api_key_env: str = field(
        default="MEMSTATE_API_KEY",
        metadata={"help": "Environment variable holding the bearer token; when it is unset or empty, no auth."},
    )
    max_body_bytes: int = field(default=1_000_000, metadata={"help": "Larger request bodies get 413."})
    max_facts: int = field(default=256, metadata={"help": "More facts in one request get 422."})
    max_relations: int = field(default=1024, metadata={"help": "More relations in one request get 422."})
    max_options: int = field(default=26, metadata={"help": "More options in one request get 422."})
    max_text_chars: int = field(
        default=8000, metadata={"help": "Longest question, fact or option text (characters); longer gets 422."}
    )
    host: str = field(default="127.0.0.1", metadata={"help": "Address the API listens on."})
    port: int = field(default=8080, metadata={"help": "Port the API listens on."})

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {self.max_concurrency}")
        if self.max_queue is not None and self.max_queue < 0:
            raise ValueError(f"max_queue must be 0 or more (or null: max_concurrency), got {self.max_queue}")
        if self.max_queue_wait_s is not None and not self.max_queue_wait_s > 0:
            raise ValueError(
                f"max_queue_wait_s must be a positive number of seconds or null, got {self.max_queue_wait_s}"
            )
        if not (math.isfinite(self.queue_timeout_s) and self.queue_timeout_s > 0):
            raise ValueError(f"queue_timeout_s must be a positive number of seconds, got {self.queue_timeout_s}")

    @property
    def queue(self) -> int:
        """``max_queue``, its default resolved."""
        return self.max_concurrency if self.max_queue is None else self.max_queue


# --- error bodies (the request and the answer: shapes.py) --------------------------------------------------------


class ErrorBody(BaseModel):
    detail: str


ERRORS: dict = {code: {"model": ErrorBody} for code in (400, 401, 413, 422, 429, 502, 503, 504)}
_RETRY_AFTER = "Seconds to wait before retrying (serve/admission.py: the backlog's time to clear at the recent pace)."
ERRORS[429]["headers"] = {"Retry-After": {"description": _RETRY_AFTER, "required": True, "schema": {"type": "integer"}}}
ERRORS[503]["headers"] = {"Retry-After": {"description": _RETRY_AFTER + " Only when the request waited past its "
                                          "deadline in the queue.", "schema": {"type": "integer"}}}  # fmt: skip
ERRORS[429]["description"] = "The API is at capacity: retry after Retry-After seconds."


class PolicyError(Exception):
    """The policy could not produce a reply: HTTP ``status`` for our caller, ``reason`` for the metrics."""

    def __init__(self, status: int, reason: str, detail: str):
        super().__init__(detail)
        self.status, self.reason, self.detail = status, reason, detail


# --- the policy backend ------------------------------------------------------------------------------------------


def _listed_model(listed: dict) -> str:
    try:
        return listed["data"][0]["id"]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"/v1/models lists no model: {str(listed)[:200]}") from None


class PolicyClient:
    """Chat completions against the policy's vLLM server (``memstate.http``: bounded to ``max_concurrency`` calls in
    flight, ``policy_retries`` retries), its failures mapped to our status codes — never an exception of its own."""

    def __init__(self, config: ApiConfig, transport: httpx.AsyncBaseTransport | None = None):
        self.config = config
        settings = HTTPSettings(
            config.policy_url, timeout=config.timeout_s, max_retries=config.policy_retries,
            backoff=config.policy_backoff_s, concurrency=config.max_concurrency,
        )  # fmt: skip
        self.client = AsyncHTTPClient(settings, transport=transport)
        self.http = self.client.http
        self.model = config.policy_model

    @contextmanager
    def _policy_errors(self, path: str) -> Iterator[None]:
        """The HTTP layer's failures of a call to ``path``, as ``PolicyError``s (our status codes)."""
        url = self.client.url(path)
        try:
            yield
        except HTTPRejected as e:
            if e.status == 400 and "context length" in e.text:
                raise PolicyError(422, "too_long", f"the prompt is too long for the policy: {e.text[:300]}") from None
            raise PolicyError(502, f"http_{e.status}", f"the policy answered {e.status}: {e.text[:300]}") from None
        except HTTPUnavailable as e:
            tries = f" ({e.attempts} attempts)" if e.attempts > 1 else ""
            if e.kind == "timeout":
                detail = f"the policy at {url} did not answer within {self.config.timeout_s} s{tries}"
                raise PolicyError(504, "timeout", detail) from None
            if e.kind == "transport":
                raise PolicyError(503, "unreachable", f"the policy at {url} is unreachable: {e.last}{tries}") from None
            if e.kind == "status":
                raise PolicyError(502, f"http_{e.status}", f"the policy answered {e.status}: {e.body}{tries}") from None
            reason = e.last.removeprefix("malformed reply: ")
            raise PolicyError(502, "garbage", f"the policy's reply is malformed: {reason}{tries}") from None

    async def model_name(self) -> str:
        if self.model is None:
            with self._policy_errors("/v1/models"):
                self.model = await self.client.request("GET", "/v1/models", parse=_listed_model)
        return self.model

    async def chat(self, messages: list[dict]) -> ChatReply:
        """The policy's reply: its text and whether it was cut off at ``max_tokens``."""
        config = self.config
        request = chat_request(
            await self.model_name(), messages, temperature=config.temperature, max_tokens=config.max_tokens
        )
        with self._policy_errors(CHAT_COMPLETIONS):
            return await achat(self.client, request)

    async def healthy(self) -> bool:
        # One quick attempt on the raw client, outside the concurrency bound: a probe must not queue behind chats.
        try:
            return (await self.http.get("/health", timeout=2.0)).status_code == 200
        except httpx.HTTPError:
            return False


# --- checks that need the configured limits ----------------------------------------------------------------------

MAX_FACT_ID_CHARS = 64  # a limit on what a client sends, like ApiConfig's; the schema (data) sets none


def check_request(body: ReasoningStateRequest, config: ApiConfig) -> tuple[list[Fact], list[Relation]]:
    """Limits and cross-field checks; raise 422 naming the field, else the schema's Fact/Relation objects."""

    def reject(detail: str):
        raise HTTPException(422, detail)

    for name, items, most in (
        ("facts", body.facts, config.max_facts),
        ("relations", body.relations, config.max_relations),
        ("options", body.options, config.max_options),
    ):
        if len(items) > most:
            reject(f"body.{name}: {len(items)} items, at most {most} allowed")
    for i, fact in enumerate(body.facts):
        if len(fact.id) > MAX_FACT_ID_CHARS:
            reject(f"body.facts[{i}].id: {len(fact.id)} characters, at most {MAX_FACT_ID_CHARS} allowed")
    texts = [("body.question", body.question)] + [(f"body.facts[{i}].text", f.text) for i, f in enumerate(body.facts)]
    texts += [(f"body.options[{i}]", o) for i, o in enumerate(body.options)]
    for where, text in texts:
        if len(text) > config.max_text_chars:
            reject(f"{where}: {len(text)} characters, at most {config.max_text_chars} allowed")
        if not text.strip():
            reject(f"{where}: must not be blank")
    if len(body.options) == 1:
        reject("body.options: give at least 2 options, or none")
    ids = [f.id for f in body.facts]
    seen = set()
    for i, fact_id in enumerate(ids):
        if fact_id in seen:
            reject(f"body.facts[{i}].id: duplicate id {fact_id!r}")
        seen.add(fact_id)
    for i, rel in enumerate(body.relations):
        for end in ("src", "dst"):
            if getattr(rel, end) not in seen:
                reject(f"body.relations[{i}].{end}: unknown fact id {getattr(rel, end)!r} (facts are {ids[:20]})")
        if rel.src == rel.dst:
            reject(f"body.relations[{i}]: relation from {rel.src!r} to itself")
    return [Fact(**asdict(f)) for f in body.facts], body.relations  # a request's facts have no role: the default


# Facts and relations are dataclasses, whose unknown fields pydantic reports as keyword arguments; a client sent
# JSON, so they read as the request's own unknown fields do.
_MESSAGES = {"unexpected_keyword_argument": "Extra inputs are not permitted"}


def _validation_detail(exc: RequestValidationError) -> tuple[int, str]:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        e = next(e for e in errors if e.get("type") == "json_invalid")
        return 400, f"malformed JSON body: {e.get('ctx', {}).get('error', e.get('msg'))}"
    parts = []
    for e in errors[:10]:
        loc = ".".join(str(p) for p in e.get("loc", ()))
        parts.append(f"{loc}: {_MESSAGES.get(e.get('type'), e.get('msg'))}")
    more = f" (and {len(errors) - 10} more)" if len(errors) > 10 else ""
    return 422, "; ".join(parts) + more


class BodyLimit:
    """Pure ASGI: answer 413 before the app parses a body over ``limit`` bytes (declared or streamed)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._too_large(send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, _replay([message]), send)  # disconnect
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self._too_large(send)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        return await self.app(scope, _replay([{"type": "http.request", "body": body, "more_body": False}]), send)

    async def _too_large(self, send) -> None:
        body = json.dumps({"detail": f"request body over {self.limit} bytes"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _replay(messages: list[dict]):
    queue = list(messages)

    async def receive():
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    return receive


class Front:
    """Pure ASGI, outermost: counts every response by path and status (``count``), and answers a request that
    ``refusal`` refuses (its scope → ``Refused`` or None) with 429 and ``Retry-After`` before its body is read or
    parsed: under overload the refusals are most of the traffic, and they must not queue for the event loop behind
    the work they protect. The handler's admission stays the authority (the state may change while a body arrives)."""

    def __init__(self, app, *, count: Callable[[str, int], None], refusal: Callable[[dict], Refused | None]):
        self.app, self.count, self.refusal = app, count, refusal

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        refused = self.refusal(scope)
        if refused is not None:
            body = json.dumps({"detail": refused.detail}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       (b"retry-after", str(refused.retry_after).encode())]  # fmt: skip
            await send({"type": "http.response.start", "status": 429, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return self.count(path, 429)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.count(path, message["status"])
            await send(message)

        return await self.app(scope, receive, counting_send)


async def watch_loop_lag(observe: Callable[[float], None], every_s: float = 0.1) -> None:
    """How late the event loop wakes from a sleep, in seconds, given to ``observe`` every ``every_s``: time every
    request waits for the loop beyond its own work."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time()
        await asyncio.sleep(every_s)
        observe(max(0.0, loop.time() - asked - every_s))


# --- the app -----------------------------------------------------------------------------------------------------


def create_app(config: ApiConfig, *, policy_transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
    """The service; ``policy_transport`` lets tests replace the network below httpx."""
    api_key = os.environ.get(config.api_key_env, "") if config.api_key_env else ""
    tokenizer = None
    if config.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(config.tokenizer)
    trained = CheckpointMetadata.read(config.tokenizer) if config.tokenizer else None  # None: a hub id, a base model
    budget = trained.max_prompt_tokens if trained else DEFAULT_MAX_PROMPT_TOKENS
    max_prompt_tokens = config.max_prompt_tokens or budget
    registry = CollectorRegistry()
    requests_total = Counter("memstate_api_requests", "HTTP requests by path and status", ["path", "status"],
                             registry=registry)  # fmt: skip
    latency = Histogram("memstate_api_request_seconds", "Reasoning-state request latency", registry=registry)
    policy_latency = Histogram("memstate_api_policy_seconds", "One policy call", registry=registry)
    policy_errors = Counter("memstate_api_policy_errors", "Failed policy calls by reason", ["reason"],
                            registry=registry)  # fmt: skip
    format_failures = Counter("memstate_api_format_failures", "Policy replies that failed the format",
                              registry=registry)  # fmt: skip
    unusable = Counter("memstate_api_states_unusable", "Requests answered with format_ok false", registry=registry)
    naming = Counter(
        "memstate_api_states_naming_an_option", "States that name one of the request's options", registry=registry
    )
    truncated = Counter("memstate_api_facts_truncated", "Facts left out to fit the prompt budget", registry=registry)
    admission = Admission(config.max_concurrency, config.queue, config.max_queue_wait_s)
    shed = Counter("memstate_api_shed", "Requests refused before any work: queue_full and predicted_wait (429), "
                   "deadline (503)", ["reason"], registry=registry)  # fmt: skip
    loop_lag = Histogram(
        "memstate_api_loop_lag_seconds",
        "Event loop wake-up delay (sampled every 0.1 s)",
        buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        registry=registry,
    )
    queue_wait = Histogram("memstate_api_queue_seconds", "Wait for a slot of admitted requests", registry=registry)
    Gauge("memstate_api_queue_depth", "Requests waiting for a slot", registry=registry).set_function(
        lambda: admission.waiting
    )
    Gauge("memstate_api_in_flight", "Requests at work", registry=registry).set_function(lambda: admission.active)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.policy = PolicyClient(config, policy_transport)
        watcher = asyncio.create_task(watch_loop_lag(loop_lag.observe))
        yield
        watcher.cancel()
        await app.state.policy.client.aclose()

    app = FastAPI(
        title="memstate reasoning-state API",
        version=PROMPT_VERSION,
        description=__doc__,
        lifespan=lifespan,
    )
    app.state.admission = admission  # for tests and operators' introspection
    bearer = HTTPBearer(auto_error=False)

    async def authorize(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
        if not api_key:
            return
        if credentials is None:
            raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(credentials.credentials.encode(), api_key.encode()):
            raise HTTPException(401, "wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(RequestValidationError)
    async def on_invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        status, detail = _validation_detail(exc)
        return JSONResponse({"detail": detail}, status_code=status)

    def wait_budget(x_request_timeout: float | None) -> tuple[float, str]:
        """The longest a request may wait for a slot, and where that bound comes from (for the message)."""
        if x_request_timeout is not None and x_request_timeout < config.queue_timeout_s:
            return x_request_timeout, " (the request's X-Request-Timeout)"
        return config.queue_timeout_s, " (queue_timeout_s)"

    def refused(reason: str, detail: str) -> None:
        shed.labels(reason).inc()
        logger.info("request refused (%s): %s", reason, detail)

    def early_refusal(scope: dict) -> Refused | None:
        """What the queue would answer a well-formed, authorized reasoning-state request now; None (let the app
        answer) for anything else, so a 401 or a 422 on the header stays one."""
        if scope["path"] != PATH or scope["method"] != "POST":
            return None
        headers = dict(scope["headers"])
        if api_key and not hmac.compare_digest(headers.get(b"authorization", b""), b"Bearer " + api_key.encode()):
            return None
        timeout = None
        if b"x-request-timeout" in headers:
            try:
                timeout = float(headers[b"x-request-timeout"])
            except ValueError:
                return None
            if not (math.isfinite(timeout) and timeout > 0):
                return None
        refusal = admission.refusal(*wait_budget(timeout))
        if refusal is not None:
            refused(refusal.reason, refusal.detail)
        return refusal

    def count(path: str, status: int) -> None:
        requests_total.labels(path if path in KNOWN_PATHS else "other", str(status)).inc()

    @app.post(
        PATH,
        response_model=ReasoningStateResponse,
        responses=ERRORS,
        dependencies=[Depends(authorize)],
    )
    async def reasoning_state(
        body: ReasoningStateRequest,
        request: Request,
        x_request_timeout: Annotated[
            float | None,
            Header(
                gt=0,
                allow_inf_nan=False,
                description="Seconds the client waits for the answer: the request waits for a slot no longer than "
                "this (nor than queue_timeout_s), else it gets 503 with Retry-After.",
            ),
        ] = None,
    ) -> ReasoningStateResponse:
        started = time.perf_counter()
        facts, relations = check_request(body, config)
        budget, why = wait_budget(x_request_timeout)
        try:
            async with admission.slot(budget, why) as waited:
                queue_wait.observe(waited)
                return await answer(body, facts, relations, request.app.state.policy, started)
        except Refused as e:
            refused(e.reason, e.detail)
            status = 503 if e.reason == "deadline" else 429
            raise HTTPException(status, e.detail, headers={"Retry-After": str(e.retry_after)}) from None

    async def answer(
        body: ReasoningStateRequest, facts: list[Fact], relations: list[Relation], policy: PolicyClient, started: float
    ) -> ReasoningStateResponse:
        """The work of one admitted request: prompt, policy calls, parse, leak gate."""
        if tokenizer is not None:
            messages, dropped = fit_policy_prompt(
                tokenizer, body.question, body.options, facts, relations, max_prompt_tokens
            )
            truncated.inc(dropped)
        else:
            messages, dropped = policy_request_messages(body.question, body.options, facts, relations), 0
        attempts, text, state = 0, "", None
        while attempts <= config.format_retries:
            attempts += 1
            call_started = time.perf_counter()
            try:
                text, cut_off = await policy.chat(messages)
            except PolicyError as e:
                policy_errors.labels(e.reason).inc()
                logger.warning("policy call failed (%s): %s", e.reason, e.detail)
                raise HTTPException(e.status, e.detail) from None
            policy_latency.observe(time.perf_counter() - call_started)
            state = parse_completion(text, cut_off=cut_off)
            if not isinstance(state, FormatError):
                break
            format_failures.inc()
        ok = not isinstance(state, FormatError)
        if not ok:
            unusable.inc()
        names = None
        if ok and body.options:  # the gate of training (its semantic check embeds text: off the event loop)
            facts_text = [f.text for f in body.facts]
            names = await asyncio.to_thread(
                leak_reason, state.text, body.options, "choice", question=body.question, facts=facts_text
            )
        if names:
            naming.inc()
        seconds = time.perf_counter() - started
        latency.observe(seconds)
        return ReasoningStateResponse(
            rules=list(state.rules) if ok else [],
            text=text,
            format_ok=ok,
            format_error=None if ok else state.reason,
            names_option=names,
            attempts=attempts,
            facts_truncated=dropped,
            model=policy.model or "",
            prompt_version=PROMPT_VERSION,
            latency_ms=round(seconds * 1000, 3),
        )

    @app.get("/healthz", responses={503: {"model": ErrorBody}})
    async def healthz(request: Request) -> dict:
        policy: PolicyClient = request.app.state.policy
        if not await policy.healthy():
            raise HTTPException(503, f"the policy at {config.policy_url} is unreachable")
        return {"status": "ok", "policy_url": config.policy_url, "prompt_version": PROMPT_VERSION}

    @app.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    KNOWN_PATHS = {PATH, "/healthz", "/metrics", "/openapi.json", "/docs"}
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    app.add_middleware(Front, count=count, refusal=early_refusal)  # added last: outermost, before the body is read
    return app
