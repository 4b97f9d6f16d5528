"""The tools of an MCP server as Chorus tools: ``<server>.<tool>``.

A call of :func:`remote_tool`'s tool runs ``tools/call`` on the server
(:mod:`orchestrator.tools.mcp_client`, imported only then) with the tool
request id in the request's ``_meta``; the arguments go to the server as
sent, and the server validates them.
"""

from __future__ import annotations

from typing import Any

from orchestrator.tools.calls import Tool, ToolContext
from orchestrator.tools.mcp_server import CLOSE_GRACE, CONNECT_TIMEOUT, MCPServerSpec
from schemas import ToolSpec


def remote_tool(
    server: MCPServerSpec,
    remote: str,
    description: str = "",
    parameters: dict[str, Any] | None = None,
) -> Tool:
    """The Chorus tool ``<server>.<remote>``: a call runs ``tools/call`` on the server."""

    async def call(arguments: dict[str, Any], ctx: ToolContext) -> Any:
        from orchestrator.tools import mcp_client  # loads mcp: only when a call runs

        return await mcp_client.call_tool(server, remote, arguments, ctx.tool_request_id)

    spec = ToolSpec(
        name=f"{server.name}.{remote}",
        description=description,
        parameters=parameters or {"type": "object", "properties": {}},
        parallelizable=server.parallelizable,
        queue=server.queue,
        timeout=CONNECT_TIMEOUT + server.timeout + CLOSE_GRACE,
    )
    return Tool(spec=spec, fn=call, arguments=_as_sent, context_param="ctx")


def _as_sent(params: dict[str, Any]) -> dict[str, Any]:
    """An MCP tool's arguments go to its server as sent: the server validates them."""
    return {"arguments": dict(params)}
