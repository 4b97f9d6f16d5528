"""Chorus: durable, distributed agent runs on Celery, Redis and Postgres.

The public API::

    from orchestrator import Agent, Client, MCPServer, ToolContext, schema_tool, tool, tool_catalog
"""

from orchestrator.agents import Agent
from orchestrator.client import Client, Job
from orchestrator.errors import (
    AgentRunError,
    ChorusError,
    ConfigurationError,
    ConversationBusyError,
    ConversationNotFound,
    InvalidRequestError,
    JobFailedError,
    ModelBehaviorError,
    ModelError,
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
from orchestrator.schematools import schema_tool, tool_catalog
from orchestrator.settings import Settings, load_settings
from orchestrator.tools import Tool, ToolContext, tool
from orchestrator.toolsets import MCPServer, MCPServerSpec

__all__ = [
    "Agent",
    "AgentRunError",
    "ChorusError",
    "Client",
    "ConfigurationError",
    "ConversationBusyError",
    "ConversationNotFound",
    "InvalidRequestError",
    "Job",
    "JobFailedError",
    "MCPServer",
    "MCPServerSpec",
    "ModelBehaviorError",
    "ModelError",
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
