"""Chorus: durable, distributed agent runs on Celery, Redis and Postgres.

The public API::

    from orchestrator import Agent, AsyncClient, Client, MCPServer, ToolContext, schema_tool, tool
    from orchestrator import tool_catalog

Every name below is resolved lazily (:mod:`orchestrator.lazy`): ``import
orchestrator`` loads none of them, and each loads only what it needs (the
client does not load the MCP client or litellm).
"""

from typing import TYPE_CHECKING

from orchestrator.lazy import lazy_exports

__all__ = [
    "Agent",
    "AgentRunError",
    "ApprovalNotFound",
    "AsyncClient",
    "AsyncJob",
    "ChorusError",
    "Client",
    "ClientClosedError",
    "ConfigurationError",
    "ConflictError",
    "ConversationBusyError",
    "ConversationNotFound",
    "InvalidRequestError",
    "Job",
    "JobFailedError",
    "MCPServer",
    "MCPServerSpec",
    "ModelBehaviorError",
    "ModelError",
    "NoStructuredOutputError",
    "PatternTimeoutError",
    "SecretInSettingsError",
    "ServiceUnavailableError",
    "SettingNotAllowedError",
    "Settings",
    "Tool",
    "ToolContext",
    "ToolExecutionError",
    "ToolOutputNotFound",
    "UnknownAgentError",
    "UnknownToolError",
    "UserError",
    "load_settings",
    "schema_tool",
    "tool",
    "tool_catalog",
]

#: Where each public name is defined; the other names of ``__all__`` are
#: the error classes of :mod:`orchestrator.errors`.
_HOMES = {
    "Agent": "orchestrator.agents",
    "AsyncClient": "orchestrator.async_client",
    "AsyncJob": "orchestrator.async_client",
    "Client": "orchestrator.client",
    "Job": "orchestrator.client",
    "MCPServer": "orchestrator.tools.toolsets",
    "MCPServerSpec": "orchestrator.tools.mcp_server",
    "Settings": "orchestrator.settings",
    "load_settings": "orchestrator.settings",
    "Tool": "orchestrator.tools.calls",
    "ToolContext": "orchestrator.tools.calls",
    "schema_tool": "orchestrator.tools.json_schema",
    "tool_catalog": "orchestrator.tools.json_schema",
    "tool": "orchestrator.tools.decorator",
}
_EXPORTS = {name: _HOMES.get(name, "orchestrator.errors") for name in __all__}

if TYPE_CHECKING:
    from orchestrator.agents import Agent
    from orchestrator.async_client import AsyncClient, AsyncJob
    from orchestrator.client import Client, Job
    from orchestrator.errors import (
        AgentRunError,
        ApprovalNotFound,
        ChorusError,
        ClientClosedError,
        ConfigurationError,
        ConflictError,
        ConversationBusyError,
        ConversationNotFound,
        InvalidRequestError,
        JobFailedError,
        ModelBehaviorError,
        ModelError,
        NoStructuredOutputError,
        PatternTimeoutError,
        SecretInSettingsError,
        ServiceUnavailableError,
        SettingNotAllowedError,
        ToolExecutionError,
        ToolOutputNotFound,
        UnknownAgentError,
        UnknownToolError,
        UserError,
    )
    from orchestrator.settings import Settings, load_settings
    from orchestrator.tools.calls import Tool, ToolContext
    from orchestrator.tools.decorator import tool
    from orchestrator.tools.json_schema import schema_tool, tool_catalog
    from orchestrator.tools.mcp_server import MCPServerSpec
    from orchestrator.tools.toolsets import MCPServer
else:
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
