"""``MCPServer(...)``: an MCP server whose tools an agent may call.

A server is declared in worker code and registered by name, like an agent;
an agent lists it among its tools (``AgentSpec.toolsets`` holds the names).
Its tool ``forecast`` is the Chorus tool ``<server>.forecast`` in events,
tool-call rows and history.

Discovery (``tools/list``) happens when a step offers the agent's tools,
and is cached per process for ``cache_seconds``; each tool is offered with
the server's own description and input schema. A server that cannot be
listed keeps its last known list (or offers nothing until it answers):
the step runs anyway and the failure is logged.

A call runs as any tool call (task ``chorus.tool`` on the server's queue)
through :mod:`orchestrator.tools.mcp_client`, with the tool request id in the
request's ``_meta``; a stdio server is started once per worker process and
kept while it is used (closed after ``idle_seconds`` without requests). An
error result, an exception, a timeout or a server that is down becomes an
error result the model sees; the turn goes on.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Mapping, Sequence

from orchestrator import registry
from orchestrator.errors import (
    ChorusError,
    ConfigurationError,
    InvalidRequestError,
    SecretInSettingsError,
)
from orchestrator.logs import treat_as_credentials
from orchestrator.spec_checks import url_has_credentials
from orchestrator.tools.calls import run_with_timeout
from orchestrator.tools.json_schema import parameters_validator
from orchestrator.tools.mcp_server import CLOSE_GRACE, CONNECT_TIMEOUT, MCPServerSpec
from orchestrator.tools.remote import remote_tool
from schemas import ToolSpec
from schemas.specs import NAME_PATTERN, TOOL_NAME_PATTERN

log = logging.getLogger(__name__)

#: A server's name: the namespace of its tools.
SERVER_NAME = re.compile(NAME_PATTERN)

#: The most a ``tools/list`` may take, in seconds (a step waits for it).
DISCOVERY_TIMEOUT = 15.0


def MCPServer(
    name: str,
    *,
    url: str | None = None,
    command: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    pass_env: Sequence[str] = (),
    cwd: str | None = None,
    headers: Mapping[str, str] | None = None,
    queue: str = "tools",
    timeout: float = 60.0,
    parallelizable: bool = True,
    cache_seconds: float = 30.0,
    idle_seconds: float = 300.0,
) -> MCPServerSpec:
    """Declare an MCP server and register it, so agents can list it in ``tools``.

    Args:
        name: the namespace of its tools (``name.tool``): letters, digits, ``_``, ``-``.
        url: the streamable HTTP endpoint, e.g. ``http://127.0.0.1:8931/mcp``.
        command: the stdio server's command line, e.g. ``["python", "server.py"]``.
        env: environment of the stdio server (added to a minimal safe one).
        pass_env: names of the worker's environment variables passed to the
            stdio server (how a secret reaches it).
        cwd: working directory of the stdio server.
        headers: HTTP header name → name of the environment variable holding
            its value (``{"Authorization": "WEATHER_MCP_AUTH"}``): the value is
            read at each connection, never stored, and redacted by value
            from logs, events and rows.
        queue: the Celery queue its calls run on.
        timeout: seconds before a call is recorded as failed.
        parallelizable: False makes each of its calls a barrier.
        cache_seconds: how long a worker reuses the server's tool list.
        idle_seconds: how long a worker process keeps a stdio server running
            with no request (it is started again by the next one).
    """
    where = f"MCP server {name!r}"
    if not SERVER_NAME.match(name):
        raise InvalidRequestError(
            f"{where}: the name must be 1-64 letters, digits, '_' or '-'", ["name"]
        )
    if (url is None) == (not command):
        raise InvalidRequestError(f"{where}: give exactly one of url and command", ["url"])
    if url is not None and url_has_credentials(url):
        raise SecretInSettingsError("url", "the URL carries credentials: use headers")
    if timeout <= 0 or cache_seconds < 0 or not idle_seconds >= 0:
        raise InvalidRequestError(
            f"{where}: timeout must be > 0, cache_seconds and idle_seconds >= 0", ["timeout"]
        )
    server = MCPServerSpec(
        name=name,
        url=url,
        command=tuple(command or ()),
        env=tuple(sorted((env or {}).items())),
        pass_env=tuple(pass_env),
        cwd=cwd,
        headers=tuple(sorted((headers or {}).items())),
        queue=queue,
        timeout=timeout,
        parallelizable=parallelizable,
        cache_seconds=cache_seconds,
        idle_seconds=idle_seconds,
    )
    registry.register_toolset(server)
    treat_as_credentials(variable for _, variable in server.headers)
    return server


_cache: dict[str, tuple[float, list[ToolSpec]]] = {}
_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()


def offered(name: str) -> list[ToolSpec]:
    """The tools of the registered server ``name`` as the model sees them,
    from this process's cache while it is fresh (see the module docstring)."""
    server = registry.get_toolset(name)
    with _guard:
        lock = _locks.setdefault(name, threading.Lock())
    with lock:  # one discovery per server at a time; the others reuse it
        listed_at, specs = _cache.get(name, (float("-inf"), []))
        if time.monotonic() - listed_at < server.cache_seconds:
            return specs
        try:
            specs = _discover(server)
        except ChorusError as exc:
            log.warning(
                "MCP server %s: discovery failed, offering %d known tools: %s",
                name,
                len(specs),
                exc,
            )
        _cache[name] = (time.monotonic(), specs)
        return specs


def _discover(server: MCPServerSpec) -> list[ToolSpec]:
    from orchestrator.tools import mcp_client  # loads mcp: only when a server is listed

    timeout = min(server.timeout, DISCOVERY_TIMEOUT)
    listed = run_with_timeout(
        mcp_client.list_tools,
        {"server": server, "timeout": timeout},
        CONNECT_TIMEOUT + timeout + CLOSE_GRACE,
        f"{server.name} tools/list",
    )
    specs = []
    for item in listed:
        qualified = f"{server.name}.{item.name}"
        if not re.match(TOOL_NAME_PATTERN, qualified):
            log.warning("MCP server %s: tool name %r cannot be offered", server.name, item.name)
            continue
        try:  # one bad schema would make the provider refuse the whole request
            parameters_validator(qualified, dict(item.input_schema))
        except ConfigurationError as exc:
            log.warning("MCP server %s: tool %r not offered: %s", server.name, item.name, exc)
            continue
        specs.append(
            remote_tool(server, item.name, item.description or "", dict(item.input_schema)).spec
        )
    return specs


def load_client() -> None:
    """Import the MCP client now (the ``mcp`` package, ~1.5 s): a worker
    does it before it consumes, so its first discovery or call does not."""
    from orchestrator.tools import mcp_client  # noqa: F401


def forget() -> None:
    """Drop every cached tool list (tests; a worker never needs to)."""
    _cache.clear()
