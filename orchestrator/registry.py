"""What the workers registered: tools, MCP toolsets and agents by name.

A job can only name what is here. Nothing in a payload is imported or
evaluated: modules come from the ``CHORUS_MODULES`` setting.

The declarations write here (``@tool``, ``schema_tool``, ``MCPServer``,
``Agent``); the engine, the client and the workers read. It sits below all
of them (see ``docs/architecture.md``), so it imports no declaration module
that writes into it.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable

from pydantic import BaseModel

from orchestrator.errors import ConfigurationError, UnknownAgentError, UnknownToolError
from orchestrator.tools.calls import Tool
from orchestrator.tools.mcp_server import MCPServerSpec
from orchestrator.tools.remote import remote_tool
from schemas import AgentSpec, ToolSpec
from schemas.specs import READ_TOOL_OUTPUT, TOOL_NAME_PATTERN

_tools: dict[str, Tool] = {}
_toolsets: dict[str, MCPServerSpec] = {}
_agents: dict[str, AgentSpec] = {}
_loaded: set[str] = set()
#: The pydantic model an agent declared as its ``output`` (``Agent(output=Model)``).
_output_models: dict[str, type[BaseModel]] = {}
#: What the fleet's workers published (:mod:`orchestrator.published`), as a
#: client that did not import their modules learnt it: agents by name, and
#: the names of their tools and MCP servers. Empty in a worker.
_published_agents: dict[str, AgentSpec] = {}
_published_tools: set[str] = set()
_published_toolsets: set[str] = set()


def register_tool(t: Tool) -> None:
    existing = _tools.get(t.spec.name)
    if existing is not None and _origin(existing) != _origin(t):
        raise ConfigurationError(f"two different tools are named {t.spec.name!r}")
    namespace, dot, _ = t.spec.name.partition(".")
    if dot and namespace in _toolsets:
        raise ConfigurationError(
            f"tool {t.spec.name!r} is in the namespace of MCP server {namespace!r}: "
            "a server's namespace holds only its own tools"
        )
    _tools[t.spec.name] = t


def _origin(t: Tool) -> tuple[str, str, ToolSpec]:
    # A module imported twice (as __main__ and by name) re-registers the same
    # tool. One function may serve several schema tools: the spec tells them apart.
    fn = t.fn
    return (
        getattr(fn, "__module__", type(fn).__module__),
        getattr(fn, "__qualname__", type(fn).__qualname__),
        t.spec,
    )


def register_toolset(server: MCPServerSpec) -> None:
    existing = _toolsets.get(server.name)
    if existing is not None and existing != server:
        raise ConfigurationError(f"two different MCP servers are named {server.name!r}")
    taken = [name for name in _tools if name.startswith(f"{server.name}.")]
    if taken:
        raise ConfigurationError(
            f"MCP server {server.name!r}: its namespace already holds the tool {taken[0]!r}"
        )
    _toolsets[server.name] = server


def register_agent(spec: AgentSpec) -> None:
    existing = _agents.get(spec.name)
    if existing is not None and existing != spec:
        raise ConfigurationError(f"two different agents are named {spec.name!r}")
    _agents[spec.name] = spec


def register_output_model(agent: str, model: type[BaseModel]) -> None:
    """Remember the class of an agent's structured output (``job.output()``
    returns instances of it in this process)."""
    _output_models[agent] = model


def output_model(agent: str) -> type[BaseModel] | None:
    """The class the agent ``agent`` declared for its output here, if any."""
    return _output_models.get(agent)


def get_tool(name: str) -> Tool:
    """The tool ``name``: a registered function, or ``<server>.<tool>`` of a
    registered MCP server (a registered function of that name wins)."""
    found = _tools.get(name)
    if found is not None:
        return found
    server, dot, remote = name.partition(".")
    if dot and server in _toolsets and re.match(TOOL_NAME_PATTERN, name):
        return remote_tool(_toolsets[server], remote)
    raise UnknownToolError(name, list(_tools))


def get_toolset(name: str) -> MCPServerSpec:
    try:
        return _toolsets[name]
    except KeyError:
        raise UnknownToolError(
            name, list(_toolsets), "MCP server", "declare it with MCPServer(...)"
        ) from None


def get_agent(name: str) -> AgentSpec:
    """The agent ``name``: declared here, else as the workers published it."""
    found = _agents.get(name) or _published_agents.get(name)
    if found is None:
        raise UnknownAgentError(name, sorted({*_agents, *_published_agents}))
    return found


def set_published(
    agents: Iterable[AgentSpec], tools: Iterable[str], toolsets: Iterable[str]
) -> None:
    """Know what the workers published (replacing what was known)."""
    _published_agents.clear()
    _published_agents.update((spec.name, spec) for spec in agents)
    _published_tools.clear()
    _published_tools.update(tools)
    _published_toolsets.clear()
    _published_toolsets.update(toolsets)


def only_published(spec: AgentSpec) -> bool:
    """Is ``spec`` an agent the workers published and this process did not
    declare? (Its policies, context transformers and checkpoint strategy
    are the workers' and were checked there.)"""
    return spec.name not in _agents and _published_agents.get(spec.name) == spec


def knows_agent(name: str) -> bool:
    """Is ``name`` declared here or published?"""
    return name in _agents or name in _published_agents


def _tool_known(name: str) -> bool:
    """Published as a tool, or as a tool of a published MCP server."""
    return name in _published_tools or name.partition(".")[0] in _published_toolsets


def tool_names() -> list[str]:
    return sorted(_tools)


def toolset_names() -> list[str]:
    return sorted(_toolsets)


def agent_names() -> list[str]:
    return sorted(_agents)


def check_agent(spec: AgentSpec) -> None:
    """Raise :class:`UnknownToolError` or :class:`UnknownAgentError` if the
    spec names an unregistered tool, MCP server, subagent or handoff target."""
    for name in spec.tools:
        if name != READ_TOOL_OUTPUT and not _tool_known(name):  # the built-in: every step
            get_tool(name)
    for name in spec.toolsets:
        if name not in _published_toolsets:
            get_toolset(name)
    for name in (*spec.subagents, *spec.handoffs):
        get_agent(name)


def load_modules(names: Iterable[str]) -> None:
    """Import the modules that declare tools and agents (once each)."""
    for name in names:
        if name in _loaded:
            continue
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigurationError(
                f"cannot import module {name!r} listed in CHORUS_MODULES: {exc}"
            ) from exc
        _loaded.add(name)
