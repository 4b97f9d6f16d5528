"""Which tools an agent's model may call: only what its own spec lists.

The registry holds every tool and agent a worker imported; an agent may
use only its ``tools``, the tools ``<server>.<tool>`` of the MCP servers
in its ``toolsets``, a ``subagent__X`` tool for each of its
``subagents``, and ``final_answer`` when it has an output schema. A call
to anything else is answered with an error result and never runs.
"""

from __future__ import annotations

from orchestrator.engine.output import FINAL_ANSWER
from orchestrator.engine.subagents import is_subagent_call
from schemas import AgentSpec
from schemas.specs import SUBAGENT_PREFIX


def may_call(spec: AgentSpec, tool: str) -> bool:
    if is_subagent_call(tool):
        return tool.removeprefix(SUBAGENT_PREFIX) in spec.subagents
    if tool == FINAL_ANSWER and spec.output_schema is not None:
        return True
    server, dot, _ = tool.partition(".")
    return tool in spec.tools or (bool(dot) and server in spec.toolsets)


def refusal(spec: AgentSpec, tool: str) -> str | None:
    """The error result of a call the agent may not make; None if it may."""
    if may_call(spec, tool):
        return None
    return f"Error: tool {tool!r} is not available to agent {spec.name!r}"
