"""A tiny MCP server for the README's "MCP toolsets" example.

Run over stdio (``python examples/mcp_weather.py``), as the README's
``MCPServer("weather", command=[...])`` does, or over streamable HTTP
(``python examples/mcp_weather.py http 8931``: ``http://127.0.0.1:8931/mcp``).
"""

from __future__ import annotations

import sys
from typing import Any

from mcp.server.mcpserver import MCPServer

server = MCPServer("weather")


@server.tool()
def forecast(city: str) -> dict[str, Any]:
    """Today's weather in a city."""
    return {"city": city, "sky": "clear", "temperature": 21}


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
