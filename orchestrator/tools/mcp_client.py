"""The MCP client: ``tools/list`` and ``tools/call`` on one server.

It loads the ``mcp`` package (~1.5 s): only discovery and calls import it
(:mod:`orchestrator.tools.toolsets`, :mod:`orchestrator.tools.remote`),
never a declaration.

Over streamable HTTP each request opens its own connection (the ``mcp``
package's client) and closes it when done, so a server that restarted is
simply reached again; header values come from the worker's environment at
connect time, never from the declaration itself.

A stdio server is started once per worker process, not per request: its
session is kept by an event loop thread of the process's own
(:class:`_Session`), and every request of that process, from any thread,
is a message on it (requests run concurrently on the one session). The
session is replaced when its server died (a request on a reused session
that finds the connection closed is sent once more on a new one: the tool
request id in ``_meta`` is the server's idempotency key) or a request timed
out (the server may be stuck: it is closed once its other requests end),
and closed after ``idle_seconds`` without requests. A forked child starts
with no sessions; the environment passed to the server is part of a
session's key, so a changed variable starts a new one.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import httpx2
from anyio.streams.memory import MemoryObjectReceiveStream
from mcp import Client, MCPError, StdioServerParameters, stdio_client, types
from mcp.client._transport import TransportStreams
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CONNECTION_CLOSED

from orchestrator.errors import ConfigurationError, ToolExecutionError
from orchestrator.tools.mcp_server import CONNECT_TIMEOUT, MCPServerSpec

#: The ``_meta`` key of a ``tools/call`` carrying Chorus's tool request id
#: (unique per call, stable across redeliveries: the server's idempotency key).
REQUEST_ID_META = "chorus/tool_request_id"


def _headers(server: MCPServerSpec) -> dict[str, str]:
    """The declared headers, each read from its environment variable."""
    headers = {}
    for header, variable in server.headers:
        value = os.environ.get(variable)
        if not value:
            raise ConfigurationError(
                f"MCP server {server.name!r}: environment variable {variable} "
                f"(header {header}) is not set"
            )
        headers[header] = value
    return headers


@asynccontextmanager
async def _connect(server: MCPServerSpec) -> AsyncIterator[Client]:
    """A new connection to the HTTP server (closed on exit)."""
    assert server.url is not None
    http = httpx2.AsyncClient(headers=_headers(server), timeout=httpx2.Timeout(None))
    async with http, Client(streamable_http_client(server.url, http_client=http)) as client:
        yield client


@dataclass(eq=False)
class _Session:
    """A stdio server's process and session, kept by :func:`_own` on the
    sessions' loop; every field is read and written on that loop only."""

    key: tuple[Any, ...]
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    client: Client | None = None
    failure: BaseException | None = None
    streams: TransportStreams | None = None
    busy: int = 0  # requests in flight
    served: int = 0  # requests it answered: a reused session is retried once when found dead
    retired: bool = False  # takes no new request; closed once ``busy`` is 0
    idle: asyncio.TimerHandle | None = None

    def alive(self) -> bool:
        """Not retired, and its server's stdout still open (a dead server's is closed)."""
        read = self.streams[0] if self.streams is not None else None
        closed = isinstance(read, MemoryObjectReceiveStream) and (
            read.statistics().open_send_streams == 0
        )
        return not self.retired and not closed

    def retire(self) -> None:
        """Take no new request; close once the ones in flight end."""
        self.retired = True
        if _sessions.get(self.key) is self:
            del _sessions[self.key]
        if self.busy == 0:
            self.stop.set()


#: This process's stdio sessions by key (:func:`_stdio_params`), on the loop of :func:`_loop`.
_sessions: dict[tuple[Any, ...], _Session] = {}
#: The tasks holding them (the loop keeps only weak references to tasks).
_owners: set[asyncio.Task[None]] = set()
_loop_of_process: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _loop() -> asyncio.AbstractEventLoop:
    """The event loop keeping this process's stdio sessions (a daemon thread, started once)."""
    global _loop_of_process
    with _loop_lock:
        if _loop_of_process is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="chorus-mcp-sessions", daemon=True
            )
            thread.start()
            _loop_of_process = loop
        return _loop_of_process


def _forget_sessions() -> None:
    """In a forked child: the parent's loop thread and sessions are not there."""
    global _loop_of_process, _loop_lock
    _loop_of_process, _loop_lock = None, threading.Lock()
    _sessions.clear()
    _owners.clear()


os.register_at_fork(after_in_child=_forget_sessions)


def _stdio_params(server: MCPServerSpec) -> tuple[tuple[Any, ...], StdioServerParameters]:
    """The key of the server's session (the declaration and the environment
    it gets from the worker's) and how to start it."""
    command, *args = server.command
    env = {name: os.environ[name] for name in server.pass_env if name in os.environ}
    key = (server, tuple(sorted(env.items())))
    params = StdioServerParameters(
        command=command, args=args, env=env | dict(server.env), cwd=server.cwd
    )
    return key, params


async def _own(session: _Session, params: StdioServerParameters) -> None:
    """Start the server and hold its session until asked to stop (then
    close it: the server's stdin first, then a kill if it lingers)."""

    @asynccontextmanager
    async def watched() -> AsyncIterator[TransportStreams]:
        async with stdio_client(params) as streams:
            session.streams = streams
            yield streams

    try:
        with anyio.CancelScope(deadline=anyio.current_time() + CONNECT_TIMEOUT) as scope:
            async with Client(watched()) as client:
                scope.deadline = float("inf")
                session.client = client
                session.ready.set()
                await session.stop.wait()
        if session.client is None:
            session.failure = TimeoutError(f"connecting timed out after {CONNECT_TIMEOUT:g}s")
    except Exception as exc:
        session.failure = exc
    finally:
        session.retire()
        session.ready.set()


@asynccontextmanager
async def _pooled(server: MCPServerSpec) -> AsyncIterator[Client]:
    """The process's session of the stdio server (started if there is none
    alive), for one request; on the sessions' loop only."""
    key, params = _stdio_params(server)
    session = _sessions.get(key)
    if session is None or not session.alive():
        if session is not None:
            session.retire()
        session = _sessions[key] = _Session(key)
        owner = asyncio.get_running_loop().create_task(_own(session, params))
        _owners.add(owner)
        owner.add_done_callback(_owners.discard)
    session.busy += 1
    if session.idle is not None:
        session.idle.cancel()
        session.idle = None
    try:
        await session.ready.wait()
        if session.client is None:
            raise session.failure or ConnectionError("the server's session closed")
        yield session.client
        session.served += 1
    except BaseException as exc:  # a timeout, a dead server: a new session for the next request
        if not (isinstance(exc, MCPError) and exc.error.code != CONNECTION_CLOSED):
            session.retire()
        raise
    finally:
        session.busy -= 1
        if session.retired and session.busy == 0:
            session.stop.set()
        elif session.busy == 0:  # closed unless a request comes first (it cancels this)
            session.idle = asyncio.get_running_loop().call_later(
                server.idle_seconds, session.retire
            )


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups of the client's task groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


async def _request(server: MCPServerSpec, what: str, timeout: float, fn: Any) -> Any:
    """Run ``fn(client)``: on a new connection over HTTP, on the process's
    session over stdio (on the sessions' loop; see the module docstring)."""
    if server.url is not None:
        return await _attempt(server, what, timeout, fn, _connect)
    on_loop = asyncio.run_coroutine_threadsafe(_on_session(server, what, timeout, fn), _loop())
    return await asyncio.wrap_future(on_loop)


async def _on_session(server: MCPServerSpec, what: str, timeout: float, fn: Any) -> Any:
    """:func:`_attempt` on the stdio server's session; once more on a new
    session if a reused one turned out to be closed (its server died)."""
    session = _sessions.get(_stdio_params(server)[0])
    reused = session is not None and session.alive() and session.served > 0
    try:
        return await _attempt(server, what, timeout, fn, _pooled)
    except ToolExecutionError as exc:
        cause = exc.__cause__
        if not (reused and isinstance(cause, MCPError) and cause.error.code == CONNECTION_CLOSED):
            raise
    return await _attempt(server, what, timeout, fn, _pooled)


async def _attempt(
    server: MCPServerSpec,
    what: str,
    timeout: float,
    fn: Any,
    connect: Callable[[MCPServerSpec], AbstractAsyncContextManager[Client]],
) -> Any:
    """Run ``fn(client)`` on a client from ``connect``: ``CONNECT_TIMEOUT``
    seconds to connect (start a stdio server), then ``timeout`` for the
    request. Every failure becomes a :class:`ToolExecutionError` naming the
    server."""
    done: list[Any] = []
    phase = f"connecting timed out after {CONNECT_TIMEOUT:g}s"
    try:
        with anyio.CancelScope(deadline=anyio.current_time() + CONNECT_TIMEOUT) as scope:
            async with connect(server) as client:
                phase = f"timed out after {timeout:g}s"
                scope.deadline = anyio.current_time() + timeout
                done.append(await fn(client))
    except ConfigurationError:
        raise
    except BaseException as exc:  # the client's task groups wrap errors in groups
        leaf = _leaf(exc)
        if not isinstance(leaf, Exception):
            raise
        detail = f"failed: {type(leaf).__name__}: {leaf}"
        raise ToolExecutionError(f"MCP server {server.name!r}: {what} {detail}") from leaf
    if not done:  # the scope's deadline passed
        raise ToolExecutionError(f"MCP server {server.name!r}: {what} {phase}")
    return done[0]


async def list_tools(server: MCPServerSpec, timeout: float) -> list[types.Tool]:
    """Every tool the server lists (following its pages)."""

    async def fetch(client: Client) -> list[types.Tool]:
        tools: list[types.Tool] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    result: list[types.Tool] = await _request(server, "tools/list", timeout, fetch)
    return result


async def call_tool(
    server: MCPServerSpec, tool: str, arguments: dict[str, Any], request_id: str
) -> Any:
    """Call ``tool`` with the request id in ``_meta``; return its JSON result
    (the structured content, else the text). An error result raises
    :class:`ToolExecutionError` with the server's message."""

    async def call(client: Client) -> types.CallToolResult:
        meta = cast("types.RequestParamsMeta", {REQUEST_ID_META: request_id})
        return await client.call_tool(tool, arguments, meta=meta)

    what = f"tools/call {tool!r}"
    result: types.CallToolResult = await _request(server, what, server.timeout, call)
    texts = [c.text for c in result.content if isinstance(c, types.TextContent)]
    if result.is_error:
        detail = "\n".join(texts) or "no detail"
        raise ToolExecutionError(f"MCP tool {server.name}.{tool} returned an error: {detail}")
    if result.structured_content is not None:
        return result.structured_content
    if len(texts) == len(result.content):
        return "\n".join(texts)
    return [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in result.content]
