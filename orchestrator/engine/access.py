"""Which tools an agent's model may call: only what its own spec lists.

The registry holds every tool and agent a worker imported; an agent may
use only its ``tools``, the tools ``<server>.<tool>`` of the MCP servers
in its ``toolsets``, a ``subagent__X`` tool for each of its
``subagents``, a ``handoff__X`` tool for each of its ``handoffs``,
``final_answer`` when it has an output schema, ``manage_todo_list``
when it plans and ``read_tool_output`` when it has tools or servers
(``orchestrator/engine/tool_outputs.py``: offered where a prompt holds a cut
output, or on every step when the agent lists it in ``tools``). A call
to anything else is answered with an error result and never runs.

The rule runs as the built-in :class:`ToolAccess` policy (``before_tool``,
before the agent's own tool hooks) when a tool or subagent call is about
to run, and as :func:`refusal` where a step stores its reply's calls.

A step allows only what it offered (``offered``: the qualified names of
its tool list): an MCP server's namespace holds just the tools the server
listed, and had a valid schema for, when the step was built; a tool the
worker lacks, or a built-in the step did not offer, is refused as well.
"""

from __future__ import annotations

from collections.abc import Collection

from orchestrator.engine.handoffs import is_handoff_call
from orchestrator.engine.planning import PLAN_TOOL
from orchestrator.engine.structured_output import FINAL_ANSWER
from orchestrator.engine.subagents import is_subagent_call
from orchestrator.engine.tool_outputs import READ_TOOL_OUTPUT, reads_outputs
from orchestrator.policies import Policy, Stop, ToolCall
from schemas import AgentSpec
from schemas.specs import HANDOFF_PREFIX, SUBAGENT_PREFIX


def builtin_names(spec: AgentSpec) -> list[str]:
    """The built-in tools the agent is offered: ``manage_todo_list`` when it
    plans, ``read_tool_output`` when it has tools or servers, and
    ``final_answer`` when it has an output schema."""
    plan = [PLAN_TOOL] if spec.planning else []
    read = [READ_TOOL_OUTPUT] if reads_outputs(spec) else []
    final = [FINAL_ANSWER] if spec.output_schema is not None else []
    return [*plan, *read, *final]


def may_call(spec: AgentSpec, tool: str) -> bool:
    if tool in builtin_names(spec):
        return True
    if is_subagent_call(tool):
        return tool.removeprefix(SUBAGENT_PREFIX) in spec.subagents
    if is_handoff_call(tool):
        return tool.removeprefix(HANDOFF_PREFIX) in spec.handoffs
    server, dot, _ = tool.partition(".")
    return tool in spec.tools or (bool(dot) and server in spec.toolsets)


def refusal(spec: AgentSpec, tool: str, offered: Collection[str] | None = None) -> str | None:
    """The error result of a call the agent may not make; None if it may.
    ``offered``: what the step offered (None: anything the spec allows)."""
    if may_call(spec, tool) and (offered is None or tool in offered):
        return None
    return f"Error: tool {tool!r} is not available to agent {spec.name!r}"


class ToolAccess(Policy):
    """Only the agent's own tools and subagents run: a built-in policy that
    every tool and subagent call goes through first. A call the agent may
    not make gets :func:`refusal` as its error result and never runs."""

    name = "tool-access"

    def before_tool(self, call: ToolCall) -> ToolCall | Stop:
        refused = refusal(call.agent, call.tool)
        return call if refused is None else Stop(refused)
