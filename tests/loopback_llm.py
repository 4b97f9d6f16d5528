"""A tiny OpenAI-compatible chat server on loopback, for tests.

It answers ``POST /v1/chat/completions`` (and ``/chat/completions``) from a
FIFO queue of responses the test enqueues, streaming (SSE, with tool-call
arguments split across chunks and a final usage chunk when the request asks
for ``stream_options.include_usage``) or not, and records every request::

    with LoopbackLLM() as server:
        server.enqueue_error(429, n=2)          # the next two requests fail
        server.enqueue_text("Hello there")      # then this answers
        server.enqueue_tool_calls([("search", {"q": "x"})])
        litellm.completion(model="openai/any", api_base=server.base_url, ...)
        assert server.requests[0]["messages"][-1]["content"] == "hi"

Responses are served in the order enqueued; when the queue is empty the
server answers 400 "no response queued" (not retryable, so a test fails fast).
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})

#: A tool call to answer with: ``(name, arguments)`` or a mapping with keys
#: ``name``, ``arguments`` (dict, or str sent verbatim) and optional ``id``.
ToolCallSpec = tuple[str, Mapping[str, Any] | str] | Mapping[str, Any]


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received."""

    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or the raw text if it was not JSON


@dataclass(frozen=True)
class _Planned:
    status: int = 200
    text: str = ""
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)  # (id, name, args)
    usage: tuple[int, int] | None = None
    chunk_delay: float = 0.0
    reasoning: str = ""
    error: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds of silence before the response starts
    drop_after_done: bool = False  # close the connection after [DONE], the body unfinished


def _words(text: str) -> int:
    return len(text.split())


def _pieces(text: str) -> list[str]:
    return [p for p in re.split(r"(?<=\s)(?=\S)", text) if p]


def _prompt_words(body: Any) -> int:
    if not isinstance(body, dict):
        return 0
    total = 0
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            total += _words(content)
    return total


class LoopbackLLM:
    """An OpenAI-compatible chat completions server on 127.0.0.1 (random port).

    Use as a context manager; ``base_url`` ends in ``/v1`` (pass it as
    ``api_base``). Thread-safe: requests may arrive concurrently.
    """

    def __init__(self, model: str = "loopback-model", *, keep_alive: bool = False) -> None:
        self.model = model
        #: HTTP/1.1 with keep-alive, streams sent chunked, as providers do (default:
        #: HTTP/1.0, one connection a request)
        self.keep_alive = keep_alive
        #: connections accepted so far
        self.connections = 0
        self._queue: deque[_Planned] = deque()
        self._received: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle --------------------------------------------------------

    def start(self) -> LoopbackLLM:
        """Start serving in a daemon thread."""
        version = "HTTP/1.1" if self.keep_alive else "HTTP/1.0"
        handler = type("_Handler", (_Handler,), {"owner": self, "protocol_version": version})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> LoopbackLLM:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``."""
        if self._server is None:
            raise RuntimeError("LoopbackLLM is not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    # --- scripting --------------------------------------------------------

    def enqueue_text(
        self,
        text: str,
        *,
        usage: tuple[int, int] | None = None,
        chunk_delay: float = 0.0,
        reasoning: str = "",
        delay: float = 0.0,
        drop_after_done: bool = False,
    ) -> None:
        """Answer the next request with assistant text.

        Args:
            text: The text; streamed one word per chunk.
            usage: (prompt_tokens, completion_tokens); word counts if None.
            chunk_delay: Seconds to sleep before each streamed chunk.
            reasoning: Streamed first as ``reasoning_content`` deltas (as
                DeepSeek/vLLM do); sent as ``reasoning_content`` when not streaming.
            delay: Seconds of silence (not even headers) before answering.
            drop_after_done: With ``keep_alive``, close the connection right
                after ``data: [DONE]``, without the chunked body's end.
        """
        planned = _Planned(
            text=text,
            usage=usage,
            chunk_delay=chunk_delay,
            reasoning=reasoning,
            delay=delay,
            drop_after_done=drop_after_done,
        )
        self._push(planned)

    def enqueue_tool_calls(
        self,
        calls: Sequence[ToolCallSpec],
        *,
        text: str = "",
        usage: tuple[int, int] | None = None,
        chunk_delay: float = 0.0,
        delay: float = 0.0,
    ) -> None:
        """Answer the next request with tool calls (and optional text first).

        Each call streams as a chunk with id and name, then its arguments in
        three pieces, like OpenAI. Ids are ``call_<uuid hex>`` unless given.
        ``delay``: seconds of silence (not even headers) before answering.
        """
        resolved = [_resolve_call(c) for c in calls]
        planned = _Planned(
            text=text, tool_calls=resolved, usage=usage, chunk_delay=chunk_delay, delay=delay
        )
        self._push(planned)

    def enqueue_error(
        self,
        status: int,
        *,
        n: int = 1,
        message: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Answer the next ``n`` queued slots with an HTTP error (OpenAI error body)."""
        error = {
            "error": {
                "message": message or f"loopback error {status}",
                "type": "rate_limit_error" if status == 429 else "server_error",
                "code": str(status),
            }
        }
        for _ in range(n):
            self._push(_Planned(status=status, error=error, headers=dict(headers or {})))

    def _push(self, planned: _Planned) -> None:
        with self._lock:
            self._queue.append(planned)

    def _pop(self) -> _Planned | None:
        with self._lock:
            return self._queue.popleft() if self._queue else None

    # --- inspection -------------------------------------------------------

    @property
    def received(self) -> list[RecordedRequest]:
        """Every request received, in order (a copy)."""
        with self._lock:
            return list(self._received)

    @property
    def requests(self) -> list[Any]:
        """The JSON bodies of every request received, in order."""
        return [r.body for r in self.received]

    @property
    def pending(self) -> int:
        """How many enqueued responses are not served yet."""
        with self._lock:
            return len(self._queue)

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._received.append(request)


def _resolve_call(spec: ToolCallSpec) -> tuple[str, str, str]:
    if isinstance(spec, tuple):
        name, arguments = spec
        call_id = None
    else:
        name, arguments, call_id = spec["name"], spec.get("arguments", {}), spec.get("id")
    args = arguments if isinstance(arguments, str) else json.dumps(dict(arguments))
    return call_id or f"call_{uuid.uuid4().hex}", str(name), args


class _Handler(BaseHTTPRequestHandler):
    owner: LoopbackLLM

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output quiet."""

    def setup(self) -> None:
        super().setup()
        with self.owner._lock:
            self.owner.connections += 1

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode("utf-8", errors="replace")
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw
        path = self.path.split("?", 1)[0].rstrip("/")
        self.owner._record(RecordedRequest(path, dict(self.headers.items()), body))
        if path not in CHAT_PATHS and not path.endswith("/chat/completions"):  # Azure's too
            self._json(404, {"error": {"message": f"no route {path}", "type": "not_found"}})
            return
        planned = self.owner._pop()
        if planned is not None and planned.delay:
            time.sleep(planned.delay)
        if planned is None:
            error = {"message": "loopback: no response queued", "type": "invalid_request_error"}
            self._json(400, {"error": error})
        elif planned.error is not None:
            self._json(planned.status, planned.error, planned.headers)
        elif isinstance(body, dict) and body.get("stream"):
            self._stream(planned, body)
        else:
            self._json(200, _completion(self.owner.model, planned, body))

    def _json(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, planned: _Planned, body: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        chunked = self.protocol_version == "HTTP/1.1"
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        options = body.get("stream_options") or {}
        chunks = _stream_chunks(self.owner.model, planned, body, bool(options.get("include_usage")))

        def send(data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
            self.wfile.flush()

        try:
            for chunk in chunks:
                if planned.chunk_delay:
                    time.sleep(planned.chunk_delay)
                send(f"data: {json.dumps(chunk)}\n\n".encode())
            send(b"data: [DONE]\n\n")
            if planned.drop_after_done:
                self.close_connection = True
            elif chunked:
                send(b"")  # the body's end
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client stopped reading (e.g. a cancelled call)


def _usage(planned: _Planned, body: Any) -> dict[str, int]:
    if planned.usage is not None:
        prompt, completion = planned.usage
    else:
        prompt = _prompt_words(body)
        completion = _words(planned.text) + sum(1 + _words(a) for _, _, a in planned.tool_calls)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _finish_reason(planned: _Planned) -> str:
    return "tool_calls" if planned.tool_calls else "stop"


def _completion(model: str, planned: _Planned, body: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": planned.text or None}
    if planned.reasoning:
        message["reasoning_content"] = planned.reasoning
    if planned.tool_calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in planned.tool_calls
        ]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish_reason(planned)}],
        "usage": _usage(planned, body),
    }


def _stream_chunks(
    model: str, planned: _Planned, body: Any, include_usage: bool
) -> Iterator[dict[str, Any]]:
    base = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    yield chunk({"role": "assistant", "content": ""})
    for piece in _pieces(planned.reasoning):
        yield chunk({"reasoning_content": piece})
    for piece in _pieces(planned.text):
        yield chunk({"content": piece})
    for index, (call_id, name, args) in enumerate(planned.tool_calls):
        head = {"name": name, "arguments": ""}
        yield chunk(
            {"tool_calls": [{"index": index, "id": call_id, "type": "function", "function": head}]}
        )
        third = max(1, len(args) // 3)
        for start in range(0, len(args), third):
            piece = {"arguments": args[start : start + third]}
            yield chunk({"tool_calls": [{"index": index, "function": piece}]})
    yield chunk({}, _finish_reason(planned))
    if include_usage:
        yield {**base, "choices": [], "usage": _usage(planned, body)}
