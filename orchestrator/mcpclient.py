"""The MCP client of toolsets: ``tools/list`` and ``tools/call`` on one server.

Each request opens its own connection (the ``mcp`` package's client over
streamable HTTP, or a fresh server process over stdio) and closes it when
done: nothing is shared between calls, threads or forked workers, and a
server that restarted is simply reached again. Header values come from the
worker's environment at connect time, never from the declaration itself.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

import anyio
import httpx2
from mcp import Client, StdioServerParameters, stdio_client, types
from mcp.client.streamable_http import streamable_http_client

from orchestrator.errors import ConfigurationError, ToolExecutionError

if TYPE_CHECKING:
    from orchestrator.toolsets import MCPServerSpec

#: The ``_meta`` key of a ``tools/call`` carrying Chorus's tool request id
#: (unique per call, stable across redeliveries: the server's idempotency key).
REQUEST_ID_META = "chorus/tool_request_id"

#: Seconds to connect (to start a stdio server and initialize) before a
#: request fails; the request's own timeout starts once connected.
CONNECT_TIMEOUT = 30.0


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
    if server.url is not None:
        http = httpx2.AsyncClient(headers=_headers(server), timeout=httpx2.Timeout(None))
        async with http, Client(streamable_http_client(server.url, http_client=http)) as client:
            yield client
        return
    command, *args = server.command
    env = {name: os.environ[name] for name in server.pass_env if name in os.environ}
    params = StdioServerParameters(
        command=command, args=args, env=env | dict(server.env), cwd=server.cwd
    )
    async with Client(stdio_client(params)) as client:
        yield client


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups of the client's task groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


async def _request(server: MCPServerSpec, what: str, timeout: float, fn: Any) -> Any:
    """Run ``fn(client)`` on a new connection: ``CONNECT_TIMEOUT`` seconds to
    connect (start a stdio server), then ``timeout`` for the request. Every
    failure becomes a :class:`ToolExecutionError` naming the server."""
    done: list[Any] = []
    phase = f"connecting timed out after {CONNECT_TIMEOUT:g}s"
    try:
        with anyio.CancelScope(deadline=anyio.current_time() + CONNECT_TIMEOUT) as scope:
            async with _connect(server) as client:
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
