"""A real MCP server for the toolset tests (the ``mcp`` package's own server).

Run ``python -m tests.mcp_server stdio`` (over stdin/stdout) or
``python -m tests.mcp_server http PORT`` (streamable HTTP on 127.0.0.1:PORT,
path ``/mcp``). Its tools: ``echo`` returns its text, the request's
``_meta``, the server's process id (and its ``Authorization`` header),
``fail`` raises, ``slow`` sleeps, and ``broken`` is listed with an input
schema that is not a valid JSON schema (Chorus does not offer it).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("chorus-test")


@server.tool()
def echo(text: str, ctx: Context) -> dict[str, Any]:
    """Say the text back, with the request's _meta."""
    meta = ctx.request_context.meta
    headers = ctx.headers or {}
    said = {"text": text, "meta": dict(meta) if meta else {}, "pid": os.getpid()}
    if "authorization" in headers:
        said["authorization"] = headers["authorization"]
    return said


@server.tool()
def fail(reason: str) -> str:
    """Always fail, with the reason as the error message."""
    raise ToolError(f"failing on purpose: {reason}")


@server.tool()
def slow(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def broken(x: int) -> int:
    """Listed with an invalid input schema."""
    return x


_broken = server._tool_manager.get_tool("broken")
assert _broken is not None
_broken.parameters = {"type": "object", "properties": {"x": {"type": "no-such-type"}}}


def main(argv: list[str]) -> None:
    if argv[:1] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(argv[1]))
    else:
        server.run("stdio")


if __name__ == "__main__":
    main(sys.argv[1:])
