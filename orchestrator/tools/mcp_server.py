"""Where an MCP server is and how its calls run: :class:`MCPServerSpec`.

The value that ``MCPServer(...)`` (:mod:`orchestrator.tools.toolsets`)
registers; the client (:mod:`orchestrator.tools.mcp_client`) and the
remote tools (:mod:`orchestrator.tools.remote`) read it. No ``mcp`` import.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Seconds to connect (to start a stdio server and initialize) before a
#: request fails; the request's own timeout starts once connected.
CONNECT_TIMEOUT = 30.0

#: Seconds a ``tools/call`` may take beyond connecting and the server's
#: timeout, for the client to close its connection, before it is given up.
CLOSE_GRACE = 5.0


@dataclass(frozen=True)
class MCPServerSpec:
    """A registered MCP server: where it is and how its calls run.

    Exactly one of ``url`` (streamable HTTP) and ``command`` (stdio: one
    server process per worker process, kept until ``idle_seconds`` pass
    without a request) is set. ``headers`` maps an
    HTTP header to the environment variable holding its value.
    """

    name: str
    url: str | None = None
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    pass_env: tuple[str, ...] = ()
    cwd: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    queue: str = "tools"
    timeout: float = 60.0
    parallelizable: bool = True
    cache_seconds: float = 30.0
    idle_seconds: float = 300.0
