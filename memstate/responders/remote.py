"""The responder behind an OpenAI-compatible server (``vllm serve``): async, bounded, retried, fault-tolerant.

Implements the ``Responder`` protocol for the reward:

- ``answer`` (exact mode): ``POST /v1/chat/completions`` at temperature 0.
- ``answer_logprob`` (likelihood mode). Single-token candidates (the option letters of closed-set answers): one
  ``POST /v1/chat/completions`` with ``max_tokens: 1`` and vLLM's ``logprob_token_ids`` returns the raw log-prob
  of exactly those tokens — one prefill per prompt, reusing the prefix cache (a top-k ``logprobs`` list would not
  do: a model may rank the letters far below the top 20). Multi-token continuations (free text): the server
  tokenizes the chat prompt (``POST /tokenize`` with ``messages``, so the served chat template is the one used),
  the continuation's tokens are appended, and ``POST /v1/completions`` with ``prompt_logprobs`` returns every
  prompt token's log-prob (vLLM skips its prefix cache for such requests: each is a full prefill).

Requests run on one background event loop through ``memstate.http.AsyncHTTPClient`` (one connection pool, at most
``concurrency`` in flight, each with a timeout, retried with exponential backoff and full jitter on transport errors,
timeouts, 429/5xx and malformed replies). A prompt whose requests still fail after the retry budget gets ``None``
(the reward leaves it out); the counters in ``stats`` say what happened, ``last_error`` the last failure in short.
With ``deadline`` no call (all its attempts and waits) takes longer than that many seconds.

``count_prompt_tokens`` asks ``POST /tokenize`` with ``messages`` for each prompt's length (once per prompt) and
``context_length`` is the server's ``max_model_len``: ``memstate.reward.fit`` fits prompts to it.

``check_health`` (the server answers and serves ``model``; records its ``max_model_len``) and ``check_contract``
(one request of each kind scoring sends: a greedy answer, and the log-prob requests when asked; in the very shapes the
scoring code sends them; refuses a server whose replies lack what scoring reads, naming its version) run before any
work: ``make_responder`` calls both.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from memstate.chat import CHAT_COMPLETIONS, achat, chat_reply, chat_request
from memstate.errors import ServerUnavailable
from memstate.http import _REPLY_ERRORS, AsyncHTTPClient, HTTPRejected, HTTPSettings, HTTPStats, HTTPUnavailable
from memstate.prompts import Message
from memstate.responders.protocol import ContinuationLogprob

__all__ = ["HTTPStats", "OpenAIResponder", "ResponderIncompatible", "ResponderStats", "ResponderUnavailable"]

logger = logging.getLogger("memstate.responder")

TESTED_VLLM = "0.31"  # the vLLM release whose replies the scoring code was checked against (tests/vllm_notes.md)


class ResponderUnavailable(ServerUnavailable):
    """The responder endpoint cannot be reached or does not serve the expected model."""


class ResponderIncompatible(ResponderUnavailable):
    """The responder answers, but its replies lack what the score mode reads (``check_contract``)."""

    hint = f"serve the responder with vLLM {TESTED_VLLM} (the [gpu] extra), or use a score_mode it supports"


class _Unscorable(RuntimeError):
    """A prompt the server cannot score (a continuation without tokens)."""


_FAILED = (HTTPUnavailable, HTTPRejected, _Unscorable)


@dataclass
class ResponderStats(HTTPStats):
    """The HTTP layer's counters, plus the prompts answered with None."""

    unscorable_prompts: int = 0


class OpenAIResponder:
    """A ``Responder`` reached over HTTP. ``name`` labels it (default: ``model``); ``identity`` (cache keys) is the
    name and chat-template options, plus the ``root`` the server reports for ``model`` once ``check_health`` ran.
    ``check_health`` also records the server's ``max_model_len`` for ``model`` (None when it reports none),
    ``check_contract`` its ``server_version``; ``last_error`` is the last failed request in one short line."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        name: str | None = None,
        api_key: str | None = None,
        concurrency: int = 16,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        deadline: float | None = None,
        chat_template_kwargs: dict | None = None,
        seed: int = 0,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = name or model
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.deadline = deadline
        self.max_model_len: int | None = None  # the server's context for ``model`` (check_health)
        self.server_version: str | None = None  # GET /version (check_contract); None: not asked, or not told
        self.last_error: str | None = None  # the last request that failed after its retries, in short
        # Qwen3 responders answer directly; templates without the flag ignore it.
        self.chat_template_kwargs = {"enable_thinking": False} if chat_template_kwargs is None else chat_template_kwargs
        self.identity = self._identity(None)
        self.stats = ResponderStats()
        self.settings = HTTPSettings(
            self.base_url, api_key=api_key, timeout=timeout, max_retries=max_retries, backoff=backoff,
            concurrency=concurrency, deadline=deadline,
        )  # fmt: skip
        self._seed = seed
        self._token_cache: dict[str, list[int]] = {}
        self._count_cache: dict[str, int] = {}  # sha256 of a chat prompt -> its tokens (count_prompt_tokens)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="responder-http", daemon=True)
        self._thread.start()
        self._http = self._run(self._open())

    async def _open(self) -> AsyncHTTPClient:  # on the background loop, which the client then belongs to
        return AsyncHTTPClient(self.settings, stats=self.stats, seed=self._seed)

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        if self._loop.is_running():
            self._run(self._http.aclose())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    @contextlib.contextmanager
    def round_deadline(self, seconds: float | None, name: str | None = None) -> Iterator[None]:
        """Inside: no request waits past ``seconds`` from now, whatever its own ``deadline`` left (a reward round's
        budget, ``responder_round_deadline``); past it every request gives up at once (unscorable). ``name`` names
        the limit in errors."""
        if seconds is None:
            yield
            return
        self._http.cutoff = time.monotonic() + seconds
        self._http.cutoff_name = name or f"the {seconds:g} s round deadline"
        try:
            yield
        finally:
            self._http.cutoff = None

    # ---- health -------------------------------------------------------------------------------------------------

    def check_health(self) -> None:
        """Raise ``ResponderUnavailable`` unless the server answers and serves ``model`` (call before training)."""
        try:
            models = self._run(self._http.request("GET", "/v1/models", retry=False))
        except HTTPUnavailable as e:
            raise ResponderUnavailable(f"responder at {self.base_url} is unreachable: {e.last}") from None
        except HTTPRejected as e:
            detail = f"refused GET /v1/models: HTTP {e.status}"
            raise ResponderUnavailable(f"responder at {self.base_url} {detail}") from None
        entries = [m for m in models.get("data", []) if isinstance(m, dict)]
        served = [m.get("id") for m in entries]
        if self.model not in served:
            raise ResponderUnavailable(f"responder at {self.base_url} serves {served}, not {self.model!r}")
        entry = entries[served.index(self.model)]
        # vLLM's ``root``: the path or hub id the served weights were loaded from (not the URL, which may move).
        self.identity = self._identity(entry.get("root"))
        length = entry.get("max_model_len")  # vLLM lists each model's context; other servers may not
        self.max_model_len = length if isinstance(length, int) and not isinstance(length, bool) else None

    @property
    def context_length(self) -> int | None:
        """The server's ``max_model_len`` for ``model`` (recorded by ``check_health``; None before it or untold)."""
        return self.max_model_len

    def _identity(self, root: str | None) -> str:
        template = json.dumps(self.chat_template_kwargs, sort_keys=True)
        return f"{self.name}|{template}" + (f"|root={root}" if root else "")

    # ---- contract -----------------------------------------------------------------------------------------------

    def check_contract(self, *, likelihood: bool) -> None:
        """Send one request of each kind scoring will send, built by the same code as scoring's, and raise
        ``ResponderIncompatible`` (one line: the server's version, the request, what its reply lacks) unless every
        reply holds what scoring reads. Always one greedy chat request (``answer``); with ``likelihood`` (the score
        mode asks for log-probs, or the answer-flow check will) the log-prob requests too: ``/tokenize`` of two option
        letters, the chat request with their ``logprob_token_ids``, and the free-text path (``/tokenize`` of a chat
        prompt and of a continuation, then ``/v1/completions`` with ``prompt_logprobs``). Call after
        ``check_health``."""
        self.server_version = self._run(self._version())
        self._run(self._contract(likelihood))
        what = "greedy answers and log-probs" if likelihood else "greedy answers"
        logger.info("responder at %s (%s, max_model_len %s) serves %s", self.base_url, self._version_text(),
                    self.max_model_len, what)  # fmt: skip

    async def _version(self) -> str | None:
        try:
            body = await self._http.request("GET", "/version", retry=False)
        except (HTTPUnavailable, HTTPRejected):
            return None
        version = body.get("version")
        return version if isinstance(version, str) and version else None

    def _version_text(self) -> str:
        return f"server version {self.server_version}" if self.server_version else "version unknown"

    async def _probe(self, what: str, path: str, payload: dict, parse, lacks: str, needs: str):
        """One contract request: ``parse`` of its reply, or ``ResponderIncompatible`` saying what the reply lacks
        (``lacks``) and why scoring needs it (``needs``); a server that does not answer is ``ResponderUnavailable``."""
        where = f"responder at {self.base_url} ({self._version_text()})"
        try:
            body = await self._http.request("POST", path, json=payload)
        except HTTPUnavailable as e:
            raise ResponderUnavailable(f"{where} did not answer {what} (start-up check): {e.last}") from None
        except HTTPRejected as e:
            text = " ".join(e.text.split())[:200]
            raise ResponderIncompatible(f"{where} refused {what}: HTTP {e.status}: {text}; {needs}") from None
        try:
            return parse(body)
        except _REPLY_ERRORS:
            raise ResponderIncompatible(f"{where}: the reply to {what} has {lacks}; {needs}") from None

    async def _contract(self, likelihood: bool) -> None:
        messages = _CONTRACT_MESSAGES
        tested = f"(tested with vLLM {TESTED_VLLM})"
        if likelihood:
            letters = ["A", "B"]
            letter_ids = [
                await self._probe(
                    "a /tokenize request for an option letter", "/tokenize", self._text_tokens_payload(letter),
                    _parse_tokens, "no 'tokens' list of ints",
                    f"likelihood scoring tokenizes the option letters with it {tested}; use score_mode: exact",
                )
                for letter in letters
            ]  # fmt: skip
            if all(len(ids) == 1 for ids in letter_ids):  # else scoring sends the letters down the free-text path
                await self._probe(
                    "a chat request with logprob_token_ids", CHAT_COMPLETIONS,
                    self._option_payload(messages, [ids[0] for ids in letter_ids]),
                    lambda body: _parse_token_logprobs(body, letters),
                    "no choices[0].logprobs.content[0].top_logprobs entries for the requested tokens",
                    f"likelihood scoring needs them {tested}; use score_mode: exact or a vLLM that supports "
                    "logprob_token_ids",
                )  # fmt: skip
            prompt_ids = await self._probe(
                "a /tokenize request for a chat prompt", "/tokenize", self._chat_tokens_payload(messages),
                _parse_tokens, "no 'tokens' list of ints",
                f"free-text likelihood scoring tokenizes the prompt with the served chat template {tested}; use "
                "score_mode: exact",
            )  # fmt: skip
            cont = await self._probe(
                "a /tokenize request for a continuation", "/tokenize", self._text_tokens_payload(_CONTINUATION),
                _nonempty_tokens, "no non-empty 'tokens' list of ints",
                f"free-text likelihood scoring tokenizes the reference with it {tested}; use score_mode: exact",
            )  # fmt: skip
            await self._probe(
                "a /v1/completions request with prompt_logprobs", "/v1/completions",
                self._continuation_payload(prompt_ids, cont), lambda body: _sum_prompt_logprobs(body, cont),
                "no choices[0].prompt_logprobs entries (keyed by token id) for the continuation's tokens",
                f"free-text likelihood scoring needs them {tested}; use score_mode: exact or a vLLM that returns "
                "prompt_logprobs",
            )  # fmt: skip
        await self._probe(
            "a greedy chat request", CHAT_COMPLETIONS, self._answer_payload(messages, 4),
            lambda body: chat_reply(body).text,
            "no choices[0].message.content text",
            f"exact scoring reads the answer there {tested}",
        )  # fmt: skip

    # ---- requests -----------------------------------------------------------------------------------------------

    async def _checked(self, path: str, payload: dict, parse):
        """POST with the layer's retries; a body ``parse`` rejects is a malformed reply, retried in the same budget."""
        return await self._http.request("POST", path, json=payload, parse=parse)

    # The request bodies, one builder each: scoring and check_contract send exactly these.

    def _text_tokens_payload(self, text: str) -> dict:  # POST /tokenize of a continuation (an option letter)
        return {"model": self.model, "prompt": text, "add_special_tokens": False}

    def _template(self) -> dict:  # the chat template options every chat-templated request carries
        return {"chat_template_kwargs": self.chat_template_kwargs} if self.chat_template_kwargs else {}

    def _chat_tokens_payload(self, messages: list[Message]) -> dict:  # POST /tokenize of a chat prompt
        return {"model": self.model, "messages": messages, "add_generation_prompt": True, **self._template()}

    def _continuation_payload(self, prompt_ids: list[int], cont: list[int]) -> dict:  # POST /v1/completions
        return {"model": self.model, "prompt": prompt_ids + cont, "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 0}  # fmt: skip

    def _option_payload(self, messages: list[Message], ids: list[int]) -> dict:  # a chat request for token log-probs
        return chat_request(
            self.model, messages, temperature=0.0, max_tokens=1, logprobs=True, logprob_token_ids=ids,
            **self._template(),
        )  # fmt: skip

    def _answer_payload(self, messages: list[Message], max_new_tokens: int) -> dict:  # a greedy chat request
        return chat_request(self.model, messages, temperature=0.0, max_tokens=max_new_tokens, **self._template())

    def _failed(self, e: Exception) -> None:
        """Count a prompt answered with None and remember why, in one short line."""
        self.stats.count("unscorable_prompts")
        self._remember(e)

    def _remember(self, e: Exception, what: str = "") -> None:
        """Keep why a request failed, in one short line, as ``last_error``."""
        if isinstance(e, HTTPUnavailable):
            why = f"{e.method} {e.url}: {e.last}" + (" (deadline)" if e.kind == "deadline" else "")
        else:
            why = f"{type(e).__name__}: {e}"
        self.last_error = " ".join((what + why).split())[:300]

    async def _tokens(self, key: str, payload: dict) -> list[int]:
        if key not in self._token_cache:
            tokens = await self._checked("/tokenize", payload, _parse_tokens)
            self._token_cache[key] = tokens
        return self._token_cache[key]

    async def _prompt_tokens(self, messages: list[Message]) -> list[int]:
        return await self._tokens("chat:" + json.dumps(messages, sort_keys=True), self._chat_tokens_payload(messages))

    async def _prompt_count(self, messages: list[Message]) -> int | None:
        """The chat prompt's length in tokens by the server (``/tokenize`` with ``messages``, the served chat template,
        as ``_prompt_tokens`` asks); only the count is kept. None when the server could not tell (not cached)."""
        text = json.dumps(messages, sort_keys=True)
        if "chat:" + text in self._token_cache:
            return len(self._token_cache["chat:" + text])
        key = hashlib.sha256(text.encode()).hexdigest()
        if key not in self._count_cache:
            try:
                tokens = await self._checked("/tokenize", self._chat_tokens_payload(messages), _parse_tokens)
            except _FAILED as e:
                self._remember(e, "counting a prompt's tokens: ")  # not an unscorable prompt: it is sent whole
                return None
            self._count_cache[key] = len(tokens)
        return self._count_cache[key]

    async def _continuation_logprob(self, prompt_ids: list[int], continuation: str) -> ContinuationLogprob:
        cont = await self._tokens("text:" + continuation, self._text_tokens_payload(continuation))
        if not cont:
            raise _Unscorable(f"continuation {continuation!r} has no tokens")
        payload = self._continuation_payload(prompt_ids, cont)
        logprob = await self._checked("/v1/completions", payload, lambda body: _sum_prompt_logprobs(body, cont))
        return ContinuationLogprob(logprob, len(cont))

    async def _option_logprobs(self, messages: list[Message], continuations: list[str], ids: list[int]):
        """Single-token candidates (option letters): one chat request asking for exactly their log-probs."""
        payload = self._option_payload(messages, ids)
        values = await self._checked(CHAT_COMPLETIONS, payload, lambda b: _parse_token_logprobs(b, continuations))
        return [ContinuationLogprob(v, 1) for v in values]

    async def _logprobs_for(self, messages: list[Message], continuations: list[str]):
        try:
            cont_ids = [await self._tokens("text:" + c, self._text_tokens_payload(c)) for c in continuations]
            if all(len(ids) == 1 for ids in cont_ids):
                return await self._option_logprobs(messages, continuations, [ids[0] for ids in cont_ids])
            prompt_ids = await self._prompt_tokens(messages)
            return list(await asyncio.gather(*(self._continuation_logprob(prompt_ids, c) for c in continuations)))
        except _FAILED as e:
            self._failed(e)
            return None

    async def _answer_for(self, messages: list[Message], max_new_tokens: int) -> str | None:
        try:
            return (await achat(self._http, self._answer_payload(messages, max_new_tokens))).text
        except _FAILED as e:
            self._failed(e)
            return None

    # ---- Responder protocol -------------------------------------------------------------------------------------

    def answer_logprob(
        self, prompts: list[list[Message]], continuations: list[list[str]]
    ) -> list[list[ContinuationLogprob] | None]:
        async def run():
            return await asyncio.gather(
                *(self._logprobs_for(p, c) for p, c in zip(prompts, continuations, strict=True))
            )

        return list(self._run(run()))

    def answer(self, prompts: list[list[Message]], max_new_tokens: int = 32) -> list[str | None]:
        async def run():
            return await asyncio.gather(*(self._answer_for(p, max_new_tokens) for p in prompts))

        return list(self._run(run()))

    def count_prompt_tokens(self, prompts: list[list[Message]]) -> list[int | None]:
        """Each chat prompt's length in tokens as the server templates it (concurrent ``/tokenize`` requests, each
        prompt asked once per responder); None for a prompt the server could not count."""

        async def run():
            return await asyncio.gather(*(self._prompt_count(p) for p in prompts))

        return list(self._run(run()))


# What check_contract sends: a short closed-set request (like a responder prompt) and a multi-word continuation.
_CONTRACT_MESSAGES: list[Message] = [
    {"role": "system", "content": "Answer the request. Reply with the letter of one option."},
    {"role": "user", "content": "Request: Is water wet?\nA. yes\nB. no\nAnswer with the letter only."},
]
_CONTINUATION = "water is wet"


def _parse_tokens(body: dict) -> list[int]:
    tokens = body["tokens"]
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise ValueError(f"'tokens' is not a list of ints: {str(tokens)[:80]}")
    return tokens


def _nonempty_tokens(body: dict) -> list[int]:
    tokens = _parse_tokens(body)
    if not tokens:
        raise ValueError("no tokens")
    return tokens


def _parse_token_logprobs(body: dict, tokens: list[str]) -> list[float]:
    """Log-probs of the requested tokens from a chat reply with ``logprob_token_ids`` (keyed by decoded token).

    >>> body = {"choices": [{"logprobs": {"content": [{"top_logprobs": [
    ...     {"token": "A", "logprob": -1.5}, {"token": "B", "logprob": -0.5}, {"token": "\\n", "logprob": -0.1}]}]}}]}
    >>> _parse_token_logprobs(body, ["B", "A"])
    [-0.5, -1.5]
    """
    entries = body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    found = {e["token"]: float(e["logprob"]) for e in entries}
    return [found[t] for t in tokens]


def _sum_prompt_logprobs(body: dict, cont: list[int]) -> float:
    """Sum of the log-probs of the last ``len(cont)`` prompt tokens (vLLM ``prompt_logprobs``: one dict per
    prompt position, keyed by token id as a string, always holding the actual token).

    >>> body = {"choices": [{"prompt_logprobs": [None, {"5": {"logprob": -1.0}}, {"7": {"logprob": -0.5}}]}]}
    >>> _sum_prompt_logprobs(body, [7])
    -0.5
    """
    positions = body["choices"][0]["prompt_logprobs"][-len(cont) :]
    if len(positions) != len(cont):
        raise ValueError(f"{len(positions)} prompt log-probs for {len(cont)} continuation tokens")
    total = 0.0
    for token, entry in zip(cont, positions, strict=True):
        lp = entry[str(token)]["logprob"]
        if not isinstance(lp, (int, float)):
            raise ValueError(f"log-prob of token {token} is {lp!r}")
        total += float(lp)
    return total
