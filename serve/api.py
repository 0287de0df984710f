"""``memstate serve api``: the reasoning-state HTTP service the memory pipeline calls (FastAPI).

``POST /v1/reasoning-state`` takes a request and its retrieved memories in docs/design.md's shapes, builds the policy
prompt exactly as training did (``memstate.prompts``; facts truncated to the prompt budget when a tokenizer is
configured), asks the served policy (vLLM's OpenAI-compatible chat endpoint), and validates the answer with the same
``parse_completion`` as the reward (a reply cut off at ``max_tokens`` is no state). A reply that fails the format is
asked for once more (``format_retries``); if it
still fails, the answer is 200 with ``format_ok: false`` and no rules, so the caller can answer without a state.

Status codes: 400 malformed JSON; 401 missing/wrong bearer token; 408 the body did not arrive within
``body_timeout_s`` of the headers (the connection is closed); 413 body over ``max_body_bytes``; 422 a field missing,
mistyped, blank or over a limit, or a relation naming an unknown fact; 429 the API is at capacity
(``max_concurrency`` requests at work and ``max_queue`` waiting, or a predicted wait for a slot longer than
``max_queue_wait_s`` or the request's deadline), with ``Retry-After``, decided before the body is read; 502 the
policy answered with an error or garbage; 503 the policy is unreachable, or (with ``Retry-After``) the request waited
in the queue past its deadline (``queue_timeout_s``, or the request's ``X-Request-Timeout`` header when shorter); 504
the policy did not answer within ``timeout_s``. Admission and the ``Retry-After`` rule: ``serve/admission.py``.

Auth (``auth: token``, the default): the API refuses to start unless ``$api_key_env`` holds a key, and every endpoint
but ``GET /healthz`` (is the policy reachable?) needs it as a bearer token — ``/metrics`` (Prometheus) and the docs
(``/docs``, ``/redoc``, ``/openapi.json``) too, unless ``public_metrics`` / ``public_docs``. ``auth: none``
(``--no-auth``) serves everything open, with a warning. Every answer carries an ``X-Request-ID`` header (the client's,
when it sent a sane one); error bodies carry it as ``request_id`` and say nothing of the policy's address or errors,
which the server logs under that id.
"""

# No `from __future__ import annotations`: FastAPI resolves the dependency annotations of the closures in
# create_app at runtime, and string annotations would point at names local to create_app.
import asyncio
import hmac
import json
import logging
import math
import os
import re
import time
import unicodedata
import uuid
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass, field
from typing import Annotated, Literal

import httpx
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from memstate.chat import CHAT_COMPLETIONS, ChatReply, achat, chat_request
from memstate.checkpoint import CheckpointMetadata
from memstate.errors import ConfigError
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
    auth: Literal["token", "none"] = field(
        default="token",
        metadata={"help": "token: every endpoint but /healthz needs the bearer token in $api_key_env, and the API "
                  "refuses to start without one; none: no auth at all (--no-auth), logged as a warning."},
    )  # fmt: skip
    api_key_env: str = field(
        default="MEMSTATE_API_KEY",
        metadata={"help": "Environment variable holding the bearer token (auth: token). The shell's value wins over "
                  "a config's env: block."},
    )  # fmt: skip
    public_docs: bool = field(
        default=False, metadata={"help": "Serve /docs, /redoc and /openapi.json without the token."}
    )
    public_metrics: bool = field(default=False, metadata={"help": "Serve /metrics without the token."})
    max_body_bytes: int = field(default=1_000_000, metadata={"help": "Larger request bodies get 413."})
    body_timeout_s: float = field(
        default=30.0,
        metadata={"help": "Longest time to receive a request's whole body once its headers are in; a client still "
                  "sending then (or sending nothing) gets 408 and its connection is closed."},
    )  # fmt: skip
    max_facts: int = field(default=256, metadata={"help": "More facts in one request get 422."})
    max_relations: int = field(default=1024, metadata={"help": "More relations in one request get 422."})
    max_options: int = field(default=26, metadata={"help": "More options in one request get 422."})
    max_text_chars: int = field(
        default=8000, metadata={"help": "Longest question, fact or option text (characters); longer gets 422."}
    )
    max_id_chars: int = field(
        default=64, metadata={"help": "Longest fact id (and relation src/dst), in characters; longer gets 422."}
    )
    max_time_chars: int = field(default=64, metadata={"help": "Longest fact time, in characters; longer gets 422."})
    host: str = field(default="127.0.0.1", metadata={"help": "Address the API listens on."})
    port: int = field(default=8080, metadata={"help": "Port the API listens on."})

    def __post_init__(self) -> None:
        if self.auth not in ("token", "none"):
            raise ValueError(f"auth must be token or none, got {self.auth!r}")
        if self.auth == "token" and not self.api_key_env:
            raise ValueError("auth: token needs api_key_env, the variable holding the bearer token (or auth: none)")
        if not (math.isfinite(self.body_timeout_s) and self.body_timeout_s > 0):
            raise ValueError(f"body_timeout_s must be a positive number of seconds, got {self.body_timeout_s}")
        for name in ("max_body_bytes", "max_text_chars", "max_id_chars", "max_time_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
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
    request_id: str  # also the X-Request-ID header; the server's log has the details under it


ERRORS: dict = {code: {"model": ErrorBody} for code in (400, 401, 408, 413, 422, 429, 502, 503, 504)}
_RETRY_AFTER = "Seconds to wait before retrying (serve/admission.py: the backlog's time to clear at the recent pace)."
ERRORS[429]["headers"] = {"Retry-After": {"description": _RETRY_AFTER, "required": True, "schema": {"type": "integer"}}}
ERRORS[503]["headers"] = {"Retry-After": {"description": _RETRY_AFTER + " Only when the request waited past its "
                                          "deadline in the queue.", "schema": {"type": "integer"}}}  # fmt: skip
ERRORS[429]["description"] = "The API is at capacity: retry after Retry-After seconds."


class PolicyError(Exception):
    """The policy could not produce a reply: HTTP ``status`` and ``detail`` for our caller, ``reason`` for the
    metrics, ``internal`` (the policy's URL, its answer, the exception) for the server's log only."""

    def __init__(self, status: int, reason: str, detail: str, internal: str):
        super().__init__(detail)
        self.status, self.reason, self.detail, self.internal = status, reason, detail, internal


# --- the policy backend ------------------------------------------------------------------------------------------


def _listed_model(listed: dict) -> str:
    try:
        return listed["data"][0]["id"]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"/v1/models lists no model: {str(listed)[:200]}") from None


# A reply longer than max_tokens × this cannot be the policy's own (a token decodes to a few characters; 32 is far
# above any tokenizer's longest): a misrouted or hostile server's answer, refused rather than passed to our client.
MAX_CHARS_PER_TOKEN = 32


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
            internal = f"{url} answered {e.status}: {e.text[:300]}"
            if e.status == 400 and "context length" in e.text:
                detail = "the prompt is too long for the policy's context (send fewer or shorter facts)"
                raise PolicyError(422, "too_long", detail, internal) from None
            raise PolicyError(502, f"http_{e.status}", f"the policy answered {e.status}", internal) from None
        except HTTPUnavailable as e:
            tries = f" ({e.attempts} attempts)" if e.attempts > 1 else ""
            if e.kind == "timeout":
                detail = f"the policy did not answer within {self.config.timeout_s} s{tries}"
                raise PolicyError(504, "timeout", detail, f"{url}: {e.last}{tries}") from None
            if e.kind == "transport":
                internal = f"{url} is unreachable: {e.last}{tries}"
                raise PolicyError(503, "unreachable", f"the policy is unreachable{tries}", internal) from None
            if e.kind == "status":
                internal = f"{url} answered {e.status}: {e.body}{tries}"
                raise PolicyError(502, f"http_{e.status}", f"the policy answered {e.status}{tries}", internal) from None
            internal = f"{url}: {e.last}{tries}"
            raise PolicyError(502, "garbage", f"the policy's reply is malformed{tries}", internal) from None

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
            reply = await achat(self.client, request)
        most = config.max_tokens * MAX_CHARS_PER_TOKEN
        if len(reply.text) > most:  # not what a policy held to max_tokens writes: never echoed to our client
            internal = f"{self.client.url(CHAT_COMPLETIONS)}: a reply of {len(reply.text)} characters"
            raise PolicyError(502, "too_long", "the policy's reply is longer than max_tokens allows", internal)
        return reply

    async def health_problem(self) -> str | None:
        """None when the policy's /health answers 200, else what went wrong (for the server's log)."""
        # One quick attempt on the raw client, outside the concurrency bound: a probe must not queue behind chats.
        url = self.client.url("/health")
        try:
            status = (await self.http.get("/health", timeout=2.0)).status_code
        except httpx.HTTPError as e:
            return f"{url} is unreachable: {type(e).__name__}: {e}"
        return None if status == 200 else f"{url} answered {status}"


# --- checks that need the configured limits ----------------------------------------------------------------------

_INVISIBLE = {"Cc", "Cf"}  # control (NUL, ESC) and format (zero-width space, BOM, bidi marks) characters


def is_blank(text: str) -> bool:
    """Nothing a reader would see: only whitespace, control and format characters.

    >>> is_blank("\\x00\\x00"), is_blank("\\u200b \\ufeff"), is_blank(" x ")
    (True, True, False)
    """
    return all(c.isspace() or unicodedata.category(c) in _INVISIBLE for c in text)


def _text_fields(body: ReasoningStateRequest, config: ApiConfig) -> Iterator[tuple[str, str, int]]:
    """Every text a client sends: (where, text, its most characters). The schema sets no lengths (data may be
    long); a request's are bounded here, by the config."""
    yield "body.question", body.question, config.max_text_chars
    for i, fact in enumerate(body.facts):
        yield f"body.facts[{i}].id", fact.id, config.max_id_chars
        yield f"body.facts[{i}].text", fact.text, config.max_text_chars
        if fact.time is not None:
            yield f"body.facts[{i}].time", fact.time, config.max_time_chars
    for i, rel in enumerate(body.relations):
        yield f"body.relations[{i}].src", rel.src, config.max_id_chars
        yield f"body.relations[{i}].dst", rel.dst, config.max_id_chars
    for i, option in enumerate(body.options):
        yield f"body.options[{i}]", option, config.max_text_chars


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
    for where, text, most in _text_fields(body, config):
        if len(text) > most:
            reject(f"{where}: {len(text)} characters, at most {most} allowed")
        if is_blank(text):
            reject(f"{where}: must not be blank (whitespace, control and format characters only)")
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


REQUEST_ID = "memstate.request_id"  # the scope key under which Front leaves the request's id
_SANE_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")  # a client's own id, if it is one we can log as it is


def request_id(scope: dict) -> str:
    return scope.get(REQUEST_ID, "-")


async def send_error(scope: dict, send, status: int, detail: str, headers: list | None = None) -> None:
    """A JSON error answer from the ASGI layer, in the app's shape (``ErrorBody``)."""
    body = json.dumps({"detail": detail, "request_id": request_id(scope)}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """Pure ASGI: read the whole body before the app parses it; 413 for a body over ``limit`` bytes (declared or
    streamed), 408 and the connection closed for one not in within ``timeout_s`` of the headers (a client that sends
    nothing, or drips it: the deadline is for the whole body, which uvicorn's keep-alive timeout does not bound)."""

    def __init__(self, app, limit: int, timeout_s: float):
        self.app, self.limit, self.timeout_s = app, limit, timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._too_large(scope, send)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        chunks, size, more = [], 0, True
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                logger.info("request %s: %s bytes of its body in %s s (body_timeout_s): 408", request_id(scope), size,
                            self.timeout_s)  # fmt: skip
                detail = f"request body not received within {self.timeout_s:g} s"
                return await send_error(scope, send, 408, detail, [(b"connection", b"close")])
            if message["type"] != "http.request":
                return await self.app(scope, _replay([message]), send)  # disconnect
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self._too_large(scope, send)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        return await self.app(scope, _replay([{"type": "http.request", "body": body, "more_body": False}]), send)

    async def _too_large(self, scope, send) -> None:
        await send_error(scope, send, 413, f"request body over {self.limit} bytes")


def _replay(messages: list[dict]):
    queue = list(messages)

    async def receive():
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    return receive


class Front:
    """Pure ASGI, outermost: gives every request its id (the client's sane ``X-Request-ID``, else a new one; in the
    scope for the app's log lines and error bodies, and in every response's ``X-Request-ID`` header), counts every
    response by path and status (``count``), and answers a request that ``refusal`` refuses (its scope → ``Refused``
    or None) with 429 and ``Retry-After`` before its body is read or parsed: under overload the refusals are most of
    the traffic, and they must not queue for the event loop behind the work they protect. The handler's admission
    stays the authority (the state may change while a body arrives)."""

    def __init__(self, app, *, count: Callable[[str, int], None], refusal: Callable[[dict], Refused | None]):
        self.app, self.count, self.refusal = app, count, refusal

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"")
        rid = given.decode() if _SANE_REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
        scope[REQUEST_ID] = rid

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.count(path, message["status"])
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            await send(message)

        refused = self.refusal(scope)
        if refused is not None:
            headers = [(b"retry-after", str(refused.retry_after).encode())]
            return await send_error(scope, counting_send, 429, refused.detail, headers)
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
    """The service; ``policy_transport`` lets tests replace the network below httpx. With ``auth: token`` (the
    default) a ``ConfigError`` unless ``$api_key_env`` holds a key: the API never serves open by accident."""
    api_key = ""
    if config.auth == "token":
        api_key = os.environ.get(config.api_key_env, "").strip()
        if not api_key:
            raise ConfigError(
                f"auth: token, but ${config.api_key_env} (api_key_env) is unset or empty: set it to the bearer token "
                "clients must send, or serve without auth with --no-auth (auth: none in the config)"
            )
    else:
        logger.warning("auth: off (auth: none): every endpoint answers without a token")
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

    private_docs = bool(api_key) and not config.public_docs
    app = FastAPI(
        title="memstate reasoning-state API",
        version=PROMPT_VERSION,
        description=__doc__,
        lifespan=lifespan,
        # Behind the token: served below, with the token's dependency.
        openapi_url=None if private_docs else "/openapi.json",
        docs_url=None if private_docs else "/docs",
        redoc_url=None if private_docs else "/redoc",
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
    async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, detail = _validation_detail(exc)
        return JSONResponse({"detail": detail, "request_id": request_id(request.scope)}, status_code=status)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = {"detail": exc.detail, "request_id": request_id(request.scope)}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def on_bug(request: Request, exc: Exception) -> JSONResponse:
        # Starlette re-raises it after this answer, so the server logs the traceback too.
        logger.error("request %s: %s: %s", request_id(request.scope), type(exc).__name__, exc)
        return JSONResponse({"detail": "internal error", "request_id": request_id(request.scope)}, status_code=500)

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
                policy = request.app.state.policy
                return await answer(body, facts, relations, policy, started, request_id(request.scope))
        except Refused as e:
            refused(e.reason, e.detail)
            status = 503 if e.reason == "deadline" else 429
            raise HTTPException(status, e.detail, headers={"Retry-After": str(e.retry_after)}) from None

    async def answer(
        body: ReasoningStateRequest,
        facts: list[Fact],
        relations: list[Relation],
        policy: PolicyClient,
        started: float,
        rid: str,
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
                logger.warning("request %s: policy call failed (%s): %s", rid, e.reason, e.internal)
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
        """Open to all (load balancers): whether the policy answers, and nothing about where it is."""
        problem = await request.app.state.policy.health_problem()
        if problem is not None:
            logger.warning("request %s: /healthz: the policy at %s", request_id(request.scope), problem)
            raise HTTPException(503, "the policy is unreachable")
        return {"status": "ok", "prompt_version": PROMPT_VERSION}

    behind_token = {"dependencies": [Depends(authorize)], "responses": {401: ERRORS[401]}}
    metrics_auth = {} if config.public_metrics else behind_token

    @app.get("/metrics", response_class=Response, **metrics_auth)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    if private_docs:
        docs_auth = [Depends(authorize)]

        @app.get("/openapi.json", include_in_schema=False, dependencies=docs_auth)
        async def openapi_json() -> JSONResponse:
            return JSONResponse(app.openapi())

        @app.get("/docs", include_in_schema=False, dependencies=docs_auth)
        async def swagger_ui() -> Response:
            return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - Swagger UI")

        @app.get("/redoc", include_in_schema=False, dependencies=docs_auth)
        async def redoc() -> Response:
            return get_redoc_html(openapi_url="/openapi.json", title=f"{app.title} - ReDoc")

    KNOWN_PATHS = {PATH, "/healthz", "/metrics", "/openapi.json", "/docs", "/redoc"}
    app.add_middleware(BodyLimit, limit=config.max_body_bytes, timeout_s=config.body_timeout_s)
    app.add_middleware(Front, count=count, refusal=early_refusal)  # added last: outermost, before the body is read
    return app
