"""A local stand-in for the Anthropic Messages API: a real HTTP server on 127.0.0.1 that the real
SDK talks to, answering `POST /v1/messages` with scripted replies and recording every request.

    with MockAnthropic() as api:
        api.script(tool_use("propose_pipelines", {"candidates": [...]}), error(529))
        policy = ClaudePolicy(api_key="k", base_url=api.url)
        ...
        api.requests[0].body["tool_choice"]

A reply is a tool_use message (what a forced tool call returns), a text message, or an HTTP error
with the API's error body. Error replies carry `retry-after-ms` (small by default) so the SDK's
retries wait milliseconds, not seconds. When the script runs out the server answers 400 with
a message saying so (400 is not retried), so a test that asks more than it scripted fails clearly.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

import attrs
import pytest

_ids = itertools.count(1)

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               529: "overloaded_error"}


@attrs.frozen
class Reply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen
class Recorded:
    method: str
    path: str
    headers: dict[str, str]   # names lower-cased
    body: Any                 # the decoded JSON, or the raw text if it was not JSON


def message(content: list[dict[str, Any]], stop_reason: str = "tool_use", model: str = "claude-sonnet-4-5") -> Reply:
    k = next(_ids)
    return Reply(200, {"id": f"msg_mock{k:04d}", "type": "message", "role": "assistant", "model": model,
                       "content": content, "stop_reason": stop_reason, "stop_sequence": None,
                       "usage": {"input_tokens": 100, "output_tokens": 50, "cache_creation_input_tokens": 0,
                                 "cache_read_input_tokens": 0}})


def tool_use(name: str, input: Any, *, text: str | None = None, more: list[dict[str, Any]] = ()) -> Reply:
    """A message calling tool `name` with `input` (any JSON, so a test can send a malformed one)."""
    content = [{"type": "text", "text": text}] if text else []
    content.append({"type": "tool_use", "id": f"toolu_mock{next(_ids):04d}", "name": name, "input": input})
    content += list(more)
    return message(content)


def text(s: str) -> Reply:
    """A message with no tool call (a model ignoring tool_choice)."""
    return message([{"type": "text", "text": s}], stop_reason="end_turn")


def error(status: int, message: str = "", kind: str | None = None, retry_after_ms: int | None = 5) -> Reply:
    """An HTTP error with the API's error body, e.g. error(529) for overloaded."""
    kind = kind or ERROR_TYPES.get(status, "api_error")
    headers = {"retry-after-ms": str(retry_after_ms)} if retry_after_ms is not None else {}
    return Reply(status, {"type": "error", "error": {"type": kind, "message": message or f"mock {kind}"},
                          "request_id": f"req_mock{next(_ids):04d}"}, headers)


class MockAnthropic:
    """The server; a context manager. `.url` is its base URL, `.requests` what it was sent."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self._queue: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def script(self, *replies: Reply) -> MockAnthropic:
        with self._lock:
            self._queue.extend(replies)
        return self

    @property
    def pending(self) -> int:
        """Scripted replies not yet sent."""
        with self._lock:
            return len(self._queue)

    def _next(self, rec: Recorded) -> Reply:
        with self._lock:
            self.requests.append(rec)
            if rec.method != "POST" or rec.path != "/v1/messages":
                return error(404, f"mock: no route for {rec.method} {rec.path}")
            if not self._queue:
                return error(400, f"mock: the script ran out at request {len(self.requests)}")
            return self._queue.popleft()

    def start(self) -> MockAnthropic:
        mock = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's pool expects

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                rec = Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                reply = mock._next(rec)
                data = json.dumps(reply.body).encode()
                self.send_response(reply.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.send_header("request-id", f"req_mock{len(mock.requests):04d}")
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            do_POST = do_GET = _handle

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.01},
                                        name="mock-anthropic", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def mock_anthropic():
    with MockAnthropic() as api:
        yield api
