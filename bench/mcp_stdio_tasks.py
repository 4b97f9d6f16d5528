"""Worker-side half of ``bench/mcp_stdio.py``: its stdio MCP server and agents.

Imported by the workers (and the bench's client) through
``CHORUS_MODULES=bench.mcp_stdio_tasks``. It registers:

- the MCP server ``time``: the ``mcp-server-time`` reference server over
  stdio (``python -m mcp_server_time``, from the PyPI package
  ``mcp-server-time``), as Chorus runs it: one server process per worker
  process, a message per call;
- the tool ``spawned_time``: the same ``get_current_time`` call on a server
  process started for this call alone and closed after it (the ``mcp``
  client's ``Client(stdio_client(...))``), which is what every call of a
  stdio server cost before servers were kept;
- the agents ``bench-mcp-session`` and ``bench-mcp-spawn``, whose scripted
  models call ``time.get_current_time`` (respectively ``spawned_time``)
  ``CALLS`` times in one reply (one parallel segment), then answer how
  many results they were shown.
"""

from __future__ import annotations

import sys
from typing import Any

from mcp import Client, StdioServerParameters, stdio_client

from orchestrator import Agent, MCPServer, tool
from orchestrator.llm.scripted import Reply, call, register_script, scripted_model

#: Parallel calls in the measured turn (the issue's figure: twelve).
CALLS = 12
COMMAND = [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]

time_server = MCPServer("time", command=COMMAND, timeout=60)


@tool(timeout=120)
async def spawned_time(timezone: str) -> Any:
    """The current time in ``timezone``, from a server process started for this call.

    Args:
        timezone: an IANA time zone name.
    """
    command, *args = COMMAND
    async with Client(stdio_client(StdioServerParameters(command=command, args=args))) as client:
        result = await client.call_tool("get_current_time", {"timezone": timezone})
    return result.structured_content or [c.model_dump(mode="json") for c in result.content]


def _answer(messages: list[dict[str, Any]]) -> Reply:
    return Reply.say(f"times={sum(1 for m in messages if m.get('role') == 'tool')}")


ZONES = ["Europe/Lisbon", "America/New_York", "Asia/Tokyo", "Australia/Sydney"]
for agent, tool_name in (
    ("bench-mcp-session", "time__get_current_time"),
    ("bench-mcp-spawn", "spawned_time"),
):
    calls = [call(tool_name, timezone=ZONES[i % len(ZONES)]) for i in range(CALLS)]
    register_script(agent, [Reply.call(*calls), _answer])
Agent("bench-mcp-session", scripted_model("bench-mcp-session"), tools=[time_server])
Agent("bench-mcp-spawn", scripted_model("bench-mcp-spawn"), tools=[spawned_time])
