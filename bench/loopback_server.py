"""A lean OpenAI-compatible chat server for the benchmarks (asyncio, keep-alive).

Unlike ``tests/loopback_llm.py`` (a FIFO of scripted answers, one thread per
connection, HTTP/1.0) it decides each answer from the request, so that any
number of concurrent conversations can share it, and it serves hundreds of
requests per second from one process:

- the first user message may hold ``steps=N`` (default 1) and ``tools=K``
  (default 1); while the request has fewer than N assistant messages and
  offers ``tools``, the answer asks for K calls of the first tool offered,
  with arguments ``{"i": k}``;
- otherwise it answers the text ``done after <assistant messages> steps``.

Every answer waits ``--latency`` seconds first (the model's think time), then
comes whole: streamed as Server-Sent Events (one chunk per word, tool-call
arguments in pieces, a usage chunk when ``stream_options.include_usage``) or
as one JSON completion. ``GET /stats`` answers ``{"requests": n, "cpu": s}``
(chat requests served so far, and this process's CPU seconds), which the
benchmarks read to count model calls the same way for every client.

Run it in its own process (the benchmarks do)::

    python -m bench.loopback_server --port 8089 --latency 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import resource
import time
import uuid
from typing import Any

CHAT_PATHS = frozenset({b"/v1/chat/completions", b"/chat/completions"})
MODEL = "loopback-bench"
_STEPS = re.compile(r"steps=(\d+)")
_TOOLS = re.compile(r"tools=(\d+)")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _asked(body: dict[str, Any], pattern: re.Pattern[str], default: int) -> int:
    for message in body.get("messages") or []:
        if message.get("role") == "user":
            found = pattern.search(str(message.get("content") or ""))
            if found:
                return int(found.group(1))
    return default


def plan(body: dict[str, Any]) -> tuple[str, list[tuple[str, str, str]]]:
    """The answer to a request: (text, tool calls as (id, name, arguments))."""
    messages = body.get("messages") or []
    done = sum(1 for m in messages if m.get("role") == "assistant")
    tools = body.get("tools") or []
    if tools and done < _asked(body, _STEPS, 1):
        name = tools[0]["function"]["name"]
        count = _asked(body, _TOOLS, 1)
        return "", [(f"call_{uuid.uuid4().hex}", name, json.dumps({"i": k})) for k in range(count)]
    return f"done after {done} steps", []


def _usage(body: dict[str, Any], text: str, calls: list[tuple[str, str, str]]) -> dict[str, int]:
    prompt = sum(len(str(m.get("content") or "").split()) for m in body.get("messages") or [])
    completion = len(text.split()) + 4 * len(calls)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _sse(body: dict[str, Any], text: str, calls: list[tuple[str, str, str]]) -> bytes:
    head = (
        f'{{"id":"chatcmpl-{uuid.uuid4().hex}","object":"chat.completion.chunk",'
        f'"created":{int(time.time())},"model":"{MODEL}",'
    )

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return f'data: {head}"choices":[{json.dumps(choice)}]}}\n\n'

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": piece}) for piece in re.split(r"(?<=\s)(?=\S)", text) if piece]
    for index, (call_id, name, args) in enumerate(calls):
        function = {"name": name, "arguments": ""}
        out.append(
            chunk(
                {
                    "tool_calls": [
                        {"index": index, "id": call_id, "type": "function", "function": function}
                    ]
                }
            )
        )
        third = max(1, len(args) // 3)
        for start in range(0, len(args), third):
            piece = {"index": index, "function": {"arguments": args[start : start + third]}}
            out.append(chunk({"tool_calls": [piece]}))
    out.append(chunk({}, "tool_calls" if calls else "stop"))
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = json.dumps(_usage(body, text, calls))
        out.append(f'data: {head}"choices":[],"usage":{usage}}}\n\n')
    out.append("data: [DONE]\n\n")
    return "".join(out).encode()


def _json(body: dict[str, Any], text: str, calls: list[tuple[str, str, str]]) -> bytes:
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ]
    finish = "tool_calls" if calls else "stop"
    return json.dumps(
        {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": _usage(body, text, calls),
        }
    ).encode()


class Server:
    """The asyncio server: HTTP/1.1 with keep-alive, one coroutine per connection."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.split(b"\r\n")
                method, path, _ = lines[0].split(b" ", 2)
                headers = {}
                for line in lines[1:]:
                    key, _, value = line.partition(b":")
                    headers[key.strip().lower()] = value.strip()
                length = int(headers.get(b"content-length", b"0"))
                raw = await reader.readexactly(length) if length else b""
                status, ctype, payload = await self.answer(method, path.split(b"?")[0], raw)
                close = headers.get(b"connection", b"").lower() == b"close"
                writer.write(
                    b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n"
                    % (
                        status,
                        b"OK" if status == 200 else b"Error",
                        ctype,
                        len(payload),
                        b"Connection: close\r\n" if close else b"",
                    )
                    + payload
                )
                await writer.drain()
                if close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            writer.close()

    async def answer(self, method: bytes, path: bytes, raw: bytes) -> tuple[int, bytes, bytes]:
        if method == b"GET" and path == b"/stats":
            stats = {"requests": self.requests, "cpu": _cpu()}
            return 200, b"application/json", json.dumps(stats).encode()
        if method != b"POST" or path.rstrip(b"/") not in CHAT_PATHS:
            return 404, b"application/json", b'{"error":{"message":"no route"}}'
        body = json.loads(raw)
        text, calls = plan(body)
        if self.latency:
            await asyncio.sleep(self.latency)
        self.requests += 1
        if body.get("stream"):
            return 200, b"text/event-stream", _sse(body, text, calls)
        return 200, b"application/json", _json(body, text, calls)


async def serve(host: str, port: int, latency: float) -> None:
    server = Server(latency)
    listener = await asyncio.start_server(server.handle, host, port, backlog=4096)
    async with listener:
        await listener.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--latency", type=float, default=0.5, help="seconds before each answer")
    args = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port, args.latency))


if __name__ == "__main__":
    main()
