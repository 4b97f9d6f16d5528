"""Tool declarations: what a model may call, and how a call runs.

* :mod:`~orchestrator.tools.decorator`: ``@tool``, a typed function (its
  parameters' JSON schema from :mod:`~orchestrator.tools.signature`);
* :mod:`~orchestrator.tools.json_schema`: ``schema_tool`` and
  ``tool_catalog``, tools declared from a JSON schema;
* :mod:`~orchestrator.tools.toolsets`: ``MCPServer``, the tools of an MCP
  server (:mod:`~orchestrator.tools.mcp_server`,
  :mod:`~orchestrator.tools.remote`, :mod:`~orchestrator.tools.mcp_client`:
  the only module that loads ``mcp``);
* :mod:`~orchestrator.tools.calls`: :class:`Tool` and :class:`ToolContext`,
  one call run in a helper thread (:mod:`~orchestrator.tools.threads`);
* :mod:`~orchestrator.tools.names`: the provider-legal alias of each name.

Declarations write into :mod:`orchestrator.registry`; the engine reads it.
The package sits below the LLM adapter and the engine (see
``docs/architecture.md``) and resolves these names lazily, like
:mod:`orchestrator`.
"""

from typing import TYPE_CHECKING

from orchestrator.lazy import lazy_exports

#: Each name → the module that defines it.
_EXPORTS = {
    "STOP_POLL": "orchestrator.tools.calls",
    "run_with_timeout": "orchestrator.tools.calls",
    "context_params": "orchestrator.tools.decorator",
    "qualified": "orchestrator.tools.decorator",
    "tool_spec": "orchestrator.tools.decorator",
    "MCPServer": "orchestrator.tools.toolsets",
    "MCPServerSpec": "orchestrator.tools.mcp_server",
    "Tool": "orchestrator.tools.calls",
    "ToolContext": "orchestrator.tools.calls",
    "ToolStopped": "orchestrator.tools.calls",
    "schema_tool": "orchestrator.tools.json_schema",
    "tool": "orchestrator.tools.decorator",
    "tool_catalog": "orchestrator.tools.json_schema",
}

if TYPE_CHECKING:
    from orchestrator.tools.calls import STOP_POLL, Tool, ToolContext, ToolStopped, run_with_timeout
    from orchestrator.tools.decorator import context_params, qualified, tool, tool_spec
    from orchestrator.tools.json_schema import schema_tool, tool_catalog
    from orchestrator.tools.mcp_server import MCPServerSpec
    from orchestrator.tools.toolsets import MCPServer
else:
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "STOP_POLL",
    "MCPServer",
    "MCPServerSpec",
    "Tool",
    "ToolContext",
    "ToolStopped",
    "context_params",
    "qualified",
    "run_with_timeout",
    "schema_tool",
    "tool",
    "tool_catalog",
    "tool_spec",
]
