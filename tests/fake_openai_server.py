"""A real HTTP server on 127.0.0.1 speaking the slice of vLLM's OpenAI API the HTTP responder uses, that fails,
stalls or garbles a configurable share of requests and counts what it did. Values are synthetic but deterministic:
token ids are the bytes of the text, a token's log-prob depends only on its id, the chat answer is "A".

``version`` is what ``GET /version`` reports (None: 404, as a server without the route); ``max_model_len`` is listed
in ``/v1/models`` (None: left out) and, as vLLM does, a completion request whose prompt tokens and ``max_tokens`` exceed
it is refused with HTTP 400 (counted as ``too_long``); ``lacks`` names vLLM features it plays without:
``"logprob_token_ids"`` (chat replies carry no ``logprobs``, as a server that ignores the unknown field) and
``"prompt_logprobs"`` (completions carry none). ``port`` fixes the port, so a server can be stopped (``stop``) and a
new one started on the same URL.
"""

from __future__ import annotations

import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FaultyOpenAIServer:
    def __init__(
        self,
        *,
        fail: float = 0.0,
        stall: float = 0.0,
        garbage: float = 0.0,
        stall_s: float = 1.0,
        seed=0,
        api_key: str | None = None,
        port: int = 0,
        version: str | None = "0.31.0",
        max_model_len: int | None = 4096,
        lacks: tuple[str, ...] = (),
    ):
        self.fail, self.stall, self.garbage, self.stall_s = fail, stall, garbage, stall_s
        self.api_key = api_key  # as `vllm serve --api-key`: any other bearer token gets 401
        self.version, self.max_model_len, self.lacks = version, max_model_len, frozenset(lacks)
        unknown = self.lacks - {"logprob_token_ids", "prompt_logprobs"}
        assert not unknown, f"unknown features in lacks: {sorted(unknown)}"
        self.counts = {"requests": 0, "failed": 0, "stalled": 0, "garbage": 0, "ok": 0, "too_long": 0}
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_GET(self):
                server._serve(self, None)

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                server._serve(self, json.loads(self.rfile.read(length) or b"{}"))

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # the default listen backlog (5) would make connects time out under load

        self.httpd = Server(("127.0.0.1", port), Handler)  # HTTPServer sets SO_REUSEADDR: a port can be reused
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self._stopped = False

    def __enter__(self) -> FaultyOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop listening (new connections are refused; the handler closes each connection after its reply)."""
        if not self._stopped:
            self._stopped = True
            self.httpd.shutdown()
            self.httpd.server_close()

    def _outcome(self) -> str:
        with self._lock:
            self.counts["requests"] += 1
            r = self._rng.random()
            outcome = (
                "failed" if r < self.fail else
                "stalled" if r < self.fail + self.stall else
                "garbage" if r < self.fail + self.stall + self.garbage else "ok"
            )  # fmt: skip
            self.counts[outcome] += 1
            return outcome

    def _serve(self, handler: BaseHTTPRequestHandler, body: dict | None) -> None:
        if (
            self.api_key
            and handler.path != "/health"
            and handler.headers.get("Authorization") != f"Bearer {self.api_key}"
        ):
            return self._send(handler, 401, b'{"error": "Unauthorized"}')
        outcome = self._outcome()
        try:
            if outcome == "stalled":
                time.sleep(self.stall_s)  # the client has timed out by now
                return
            if outcome == "failed":
                return self._send(handler, 500, b'{"error": "injected failure"}')
            if outcome == "garbage":
                return self._send(handler, 200, b"<html>not json")
            reply = self._reply(handler.path, body)
            if reply is None:
                return self._send(handler, 404, b'{"detail": "Not Found"}')
            status = reply.get("error", {}).get("code", 200)
            if status != 200:
                with self._lock:
                    self.counts["too_long"] += 1
            self._send(handler, status, json.dumps(reply).encode())
        except (BrokenPipeError, ConnectionResetError):
            pass

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, payload: bytes) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    @staticmethod
    def tokens(body: dict) -> list[int]:
        """A request's prompt tokens: the bytes of its text (chat messages: of their JSON), or the ids it sends."""
        if "messages" in body:
            return list(json.dumps(body["messages"]).encode())
        prompt = body["prompt"]
        return list(prompt.encode()) if isinstance(prompt, str) else list(prompt)

    def _too_long(self, body: dict) -> bool:
        """As vLLM: a prompt whose tokens and ``max_tokens`` exceed ``max_model_len`` is refused (HTTP 400)."""
        return (
            self.max_model_len is not None and len(self.tokens(body)) + body.get("max_tokens", 16) > self.max_model_len
        )

    def _reply(self, path: str, body: dict | None) -> dict | None:
        if path == "/version":
            return None if self.version is None else {"version": self.version}
        if path == "/v1/models":
            model = {"id": "fake-responder", "object": "model"}
            if self.max_model_len is not None:
                model["max_model_len"] = self.max_model_len
            return {"object": "list", "data": [model]}
        if path == "/tokenize":
            tokens = self.tokens(body)
            return {"tokens": tokens, "count": len(tokens)}
        if path in ("/v1/completions", "/v1/chat/completions") and self._too_long(body):
            return {"error": {"message": f"This model's maximum context length is {self.max_model_len} tokens. "
                              f"However, you requested {len(self.tokens(body)) + body.get('max_tokens', 16)} tokens.",
                              "type": "BadRequestError", "code": 400}}  # fmt: skip
        if path == "/v1/completions":
            logprobs = [None] + [{str(t): {"logprob": -0.1 * (1 + t % 7), "rank": 1}} for t in body["prompt"][1:]]
            if "prompt_logprobs" in self.lacks:
                logprobs = None
            return {"choices": [{"text": "A", "prompt_logprobs": logprobs}]}
        if path == "/v1/chat/completions":
            choice = {"message": {"role": "assistant", "content": "A"}, "logprobs": None}
            if body.get("logprob_token_ids"):
                # A server without the extension ignores the field: `logprobs: true` alone gives the sampled token
                # with an empty top-k list.
                ids = [] if "logprob_token_ids" in self.lacks else body["logprob_token_ids"]
                top = [{"token": chr(t), "logprob": -0.1 * (1 + t % 7)} for t in ids]
                choice["logprobs"] = {"content": [{"token": "A", "logprob": -0.8, "top_logprobs": top}]}
            return {"choices": [choice]}
        return None
