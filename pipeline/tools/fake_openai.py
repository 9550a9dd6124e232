"""A local OpenAI-compatible chat-completions server that fails on cue (tests and ``examples/``).

:class:`FakeOpenAI` serves ``POST /<upstream>/v1/chat/completions`` on a free
loopback port from a daemon thread (stdlib ``ThreadingHTTPServer``), so a
``litellm.Router`` deployment with ``api_base=server.base_url("a")`` talks to
upstream ``a``. What each upstream answers is set at any time with
:meth:`FakeOpenAI.set_mode`:

- ``ok``: HTTP 200, one completion ``"ok"`` with ``usage`` (prompt 11,
  completion 7 tokens); with ``"stream": true`` server-sent events: one chunk
  per word of ``"ok from <upstream> here"`` (4 chunks), a usage chunk when
  ``stream_options.include_usage`` is set, then ``data: [DONE]``;
- ``error_500``: HTTP 500 ``{"error": {"message": "upstream exploded", "type": "server_error"}}``;
- ``error_401``: HTTP 401 ``invalid_api_key`` ("Incorrect API key provided");
- ``error_429``: HTTP 429 ``rate_limit_exceeded`` with ``Retry-After: <retry_after_s>`` (default 7);
- ``slow_stream``: as ``ok`` but each streamed chunk after the first waits
  ``gap_s`` (default 0.3 s), and the first waits ``ttft_s`` (default 0.2 s).

Every request is counted per upstream (:meth:`FakeOpenAI.calls`). Loopback
only; a request body over 1 MB is refused with HTTP 413.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FakeOpenAI", "MODES"]

MODES = ("ok", "error_500", "error_401", "error_429", "slow_stream")
_MAX_BODY = 1_000_000
PROMPT_TOKENS = 11
COMPLETION_TOKENS = 7

_ERRORS: dict[str, tuple[int, dict[str, Any]]] = {
    "error_500": (500, {"error": {"message": "upstream exploded", "type": "server_error", "code": None}}),
    "error_401": (401, {"error": {"message": "Incorrect API key provided: sk-fake***. You can find your API key "
                                             "at https://platform.openai.com/account/api-keys.",
                                  "type": "invalid_request_error", "code": "invalid_api_key"}}),
    "error_429": (429, {"error": {"message": "Rate limit reached for requests", "type": "requests",
                                  "code": "rate_limit_exceeded"}}),
}


class FakeOpenAI:
    """The server (module docstring). Use as a context manager or call :meth:`start` / :meth:`stop`.

    ``retry_after_s``: the ``Retry-After`` header of ``error_429`` (seconds, >= 0).
    ``gap_s`` / ``ttft_s``: the pauses of ``slow_stream`` (seconds, >= 0).
    """

    def __init__(self, retry_after_s: int = 7, gap_s: float = 0.3, ttft_s: float = 0.2) -> None:
        self.retry_after_s, self.gap_s, self.ttft_s = retry_after_s, gap_s, ttft_s
        self._modes: dict[str, str] = {}
        self._calls: dict[str, int] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- control -------------------------------------------------------------------------------------
    def set_mode(self, upstream: str, mode: str) -> None:
        """Make ``upstream`` answer with ``mode`` (one of :data:`MODES`); raises ``ValueError`` otherwise."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
        with self._lock:
            self._modes[upstream] = mode

    def mode(self, upstream: str) -> str:
        """The mode of ``upstream`` (``ok`` until set)."""
        with self._lock:
            return self._modes.get(upstream, "ok")

    def calls(self, upstream: str) -> int:
        """Requests ``upstream`` received so far."""
        with self._lock:
            return self._calls.get(upstream, 0)

    @property
    def port(self) -> int:
        """The listening port (after :meth:`start`)."""
        if self._server is None:
            raise RuntimeError("server not started")
        return int(self._server.server_address[1])

    def base_url(self, upstream: str) -> str:
        """The OpenAI ``api_base`` of ``upstream``: ``http://127.0.0.1:PORT/<upstream>/v1``."""
        return f"http://127.0.0.1:{self.port}/{upstream}/v1"

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> "FakeOpenAI":
        """Listen on a free loopback port and serve from a daemon thread; returns self."""
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                owner.handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-openai", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "FakeOpenAI":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- requests ------------------------------------------------------------------------------------
    def handle(self, h: BaseHTTPRequestHandler) -> None:
        """Answer one request (called by the server thread)."""
        parts = h.path.strip("/").split("/")
        length = int(h.headers.get("Content-Length") or 0)
        if length > _MAX_BODY:
            self._json(h, 413, {"error": {"message": "request too large", "type": "invalid_request_error"}})
            return
        body = json.loads(h.rfile.read(length) or b"{}")
        if len(parts) != 4 or parts[1:] != ["v1", "chat", "completions"]:
            self._json(h, 404, {"error": {"message": f"no route {h.path}", "type": "invalid_request_error"}})
            return
        upstream = parts[0]
        with self._lock:
            self._calls[upstream] = self._calls.get(upstream, 0) + 1
            mode = self._modes.get(upstream, "ok")
        if mode in _ERRORS:
            status, payload = _ERRORS[mode]
            headers = {"Retry-After": str(self.retry_after_s)} if status == 429 else {}
            self._json(h, status, payload, headers)
            return
        model = str(body.get("model", "fake"))
        if body.get("stream"):
            slow = mode == "slow_stream"
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._stream(h, upstream, model, slow, include_usage)
            return
        self._json(h, 200, {
            "id": f"chatcmpl-{upstream}-{time.monotonic_ns()}", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS,
                      "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS},
        })

    @staticmethod
    def _json(h: BaseHTTPRequestHandler, status: int, payload: dict[str, Any],
              headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)

    def _stream(self, h: BaseHTTPRequestHandler, upstream: str, model: str, slow: bool, include_usage: bool) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        cid = f"chatcmpl-{upstream}-{time.monotonic_ns()}"

        def send(obj: Any) -> None:
            data = (obj if isinstance(obj, str) else f"data: {json.dumps(obj)}\n\n").encode()
            h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            h.wfile.flush()

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        words = f"ok from {upstream} here".split(" ")
        if slow:
            time.sleep(self.ttft_s)
        for i, w in enumerate(words):
            if slow and i > 0:
                time.sleep(self.gap_s)
            send(chunk({"role": "assistant", "content": w if i == 0 else " " + w} if i == 0 else {"content": " " + w}))
        send(chunk({}, "stop"))
        if include_usage:
            send({"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
                  "choices": [], "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": len(words),
                                           "total_tokens": PROMPT_TOKENS + len(words)}})
        send("data: [DONE]\n\n")
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()
