"""Handoffs: an agent hands its conversation to another agent.

An agent's ``handoffs`` are offered to the model as tools named
``handoff__<agent>`` taking an optional ``message``. The step that stores
such a call answers it at once (:func:`answer_handoff`); the other calls of
the batch run as usual, still under the agent that made them. The
``advance`` that ends the step switches the conversation to the target
(:func:`take_over`): its ``agent`` and ``agent_spec``, the turn's
``agent``, and an ``agent.handoff`` event, in the cursor's move to the next
step. That step, and every later one, runs the target's spec (system
prompt, tools, model) on the same history, in the same turn, until it
answers or hands off again. Unlike a subagent, the target does not answer
to the agent that handed off: it answers the turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from sqlmodel import Session

from orchestrator import registry
from orchestrator.engine.subagents import about
from orchestrator.errors import ChorusError, InvalidRequestError
from orchestrator.events import Outbox
from orchestrator.store.tables import Conversation, ToolCallRow, Turn
from schemas import EventName, ToolSpec
from schemas.specs import HANDOFF_PREFIX


def is_handoff_call(tool: str) -> bool:
    return tool.startswith(HANDOFF_PREFIX)


def handoff_tool(name: str) -> ToolSpec:
    """The tool through which a model hands the conversation to agent ``name``."""
    spec = registry.get_agent(name)
    return ToolSpec(
        name=f"{HANDOFF_PREFIX}{name}",
        description=f"Hand this conversation over to the {name} agent: it takes over "
        f"and answers the user from here. {about(spec)}".strip(),
        parameters={
            "type": "object",
            "properties": {
                "message": {
                    "type": "string",
                    "description": f"What the {name} agent should know (why it takes over).",
                },
            },
            "additionalProperties": False,
        },
        queue="control",
    )


def _check(call: ToolCallRow) -> str:
    """The target of a handoff call, once its arguments and target are valid."""
    extra = sorted(set(call.params) - {"message"})
    if extra:
        raise InvalidRequestError(f"unexpected arguments: {extra}; give only message", extra)
    if not isinstance(call.params.get("message", ""), str):
        raise InvalidRequestError("message: a string is required", ["message"])
    name = call.tool.removeprefix(HANDOFF_PREFIX)
    registry.get_agent(name)
    return name


def answer_handoff(call: ToolCallRow, taken: list[str]) -> tuple[str, bool]:
    """Answer a handoff call the agent may make (its access was checked).
    ``taken``: the target of a handoff earlier in the same batch, if any
    (one handoff a step: the first valid one wins); a valid call adds its
    target. Returns the call's result and whether it is an error."""
    if taken:
        return f"Error: not handed off: this step already hands off to {taken[0]!r}", True
    try:
        name = _check(call)
    except ChorusError as exc:
        return f"Error: not handed off: {exc}", True
    taken.append(name)
    return f"Handed off to {name}: the {name} agent takes over this conversation.", False


class StoredCall(Protocol):
    """What a handoff needs of a stored call: a ``ToolCallRow``, or a row
    of those columns (as ``advance`` reads a step's calls)."""

    @property
    def tool(self) -> str: ...
    @property
    def is_error(self) -> bool: ...
    @property
    def params(self) -> dict[str, Any]: ...
    @property
    def tool_request_id(self) -> str: ...


Call = TypeVar("Call", bound=StoredCall)


def handoff_in(calls: Sequence[Call]) -> Call | None:
    """The step's handoff, if one of its calls was accepted."""
    return next((c for c in calls if is_handoff_call(c.tool) and not c.is_error), None)


def target_values(call: StoredCall) -> dict[str, Any]:
    """The conversation's columns that make the call's target its agent."""
    spec = registry.get_agent(call.tool.removeprefix(HANDOFF_PREFIX))
    return {"agent": spec.name, "agent_spec": spec.model_dump(mode="json")}


def take_over(
    session: Session, outbox: Outbox, position: tuple[str, str, int], call: StoredCall
) -> None:
    """Record the switch the cursor's move made (``target_values``): the
    turn's ``agent`` and ``agent.handoff`` (from, to, the message).
    ``position``: the conversation, turn and step of the call."""
    conversation_id, turn_id, step = position
    conv = session.get_one(Conversation, conversation_id)
    turn = session.get_one(Turn, turn_id)
    target = call.tool.removeprefix(HANDOFF_PREFIX)
    before = turn.agent
    turn.agent = target
    session.add(turn)
    outbox.record(
        EventName.AGENT_HANDOFF,
        conv,
        turn,
        step,
        from_agent=before,
        to_agent=target,
        message=call.params.get("message", ""),
        tool_request_id=call.tool_request_id,
    )
