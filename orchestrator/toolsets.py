"""Old home of MCP toolsets: now :mod:`orchestrator.tools.toolsets` (with the
server's spec in :mod:`orchestrator.tools.mcp_server` and its remote tools
in :mod:`orchestrator.tools.remote`).

Kept so that ``from orchestrator.toolsets import ...`` keeps working; new
code imports from :mod:`orchestrator` or :mod:`orchestrator.tools`.
"""

from orchestrator.tools.mcp_server import MCPServerSpec
from orchestrator.tools.remote import remote_tool
from orchestrator.tools.toolsets import MCPServer, forget, offered

__all__ = ["MCPServer", "MCPServerSpec", "forget", "offered", "remote_tool"]
