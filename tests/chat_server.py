"""A real local OpenAI-compatible chat server for tests: ``/v1/chat/completions`` answered by a Python callable
(scripted replies, or a tiny model generating with transformers); every GET (``/health``, ``/v1/models``) is 200.
Also ``live_app``: any ASGI app under a real uvicorn."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class ChatServer:
    """``/v1/chat/completions`` on 127.0.0.1, answered by ``reply(body) -> (status, content)``; records every request
    body (with its ``path``)."""

    def __init__(self, reply):
        self.reply, self.requests, self.lock = reply, [], threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": "judge", "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with server.lock:
                    server.requests.append({"path": self.path, **body})
                status, content = server.reply(body)
                choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                self._send(status, {"choices": [choice]} if status == 200 else {"error": content})

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> ChatServer:
        threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True).start()  # quick shutdown
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class TinyChatModel:
    """A tiny model behind the endpoint, generating with transformers (greedy at temperature 0)."""

    def __init__(self, path: Path):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path).eval()
        self.lock = threading.Lock()
        self.generated_tokens = 0

    def __call__(self, body: dict) -> tuple[int, str]:
        import torch

        ids = self.tokenizer.apply_chat_template(
            body["messages"], add_generation_prompt=True, tokenize=True, return_dict=False
        )[-3000:]  # the tiny model's context is 4096 positions
        with self.lock, torch.no_grad():
            out = self.model.generate(
                torch.tensor([ids]),
                max_new_tokens=min(body["max_tokens"], 24),
                do_sample=body["temperature"] > 0,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        self.generated_tokens += out.shape[1] - len(ids)
        return 200, self.tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)


@contextmanager
def live_app(app) -> Iterator[str]:
    """Serve an ASGI app with a real uvicorn on a free local port in a thread; yield its base URL."""
    import socket

    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
