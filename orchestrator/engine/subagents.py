"""Subagents: a tool call that runs a child conversation on the fleet.

An agent's subagent templates are offered to the model as tools named
``subagent__<agent>`` taking ``task`` and ``fork``. Calling one creates a
child conversation (same root; a forked child starts with a copy of the
parent's messages) and starts a turn there. The parent's call stays
``running`` without holding a worker slot; the child's end writes the
call's result and advances the parent (:func:`answer_parent`).
"""

from __future__ import annotations

from typing import Any

from sqlmodel import Session

from orchestrator import registry
from orchestrator.engine.actions import Action, RunAdvance, RunStep
from orchestrator.errors import InvalidRequestError
from orchestrator.events import Outbox
from orchestrator.runtime import Runtime
from orchestrator.store.conversation_sql import (
    NewConversation,
    first_message,
    first_turn,
    new_conversation,
    start_conversation,
)
from orchestrator.store.rows import CallRow, ConversationRow, TurnRow
from orchestrator.store.subagent_sql import answer_call, child_slot, has_child, stop_status
from orchestrator.store.tables import Turn, new_id, utcnow
from schemas import AgentSpec, ConversationState, EventName, ToolSpec, TurnStatus
from schemas.specs import SUBAGENT_PREFIX


def is_subagent_call(tool: str) -> bool:
    return tool.startswith(SUBAGENT_PREFIX)


def about(spec: AgentSpec) -> str:
    """The first line of an agent's system prompt: what a tool naming the
    agent tells the model about it."""
    return spec.system.strip().splitlines()[0] if spec.system.strip() else ""


def subagent_tool(name: str) -> ToolSpec:
    """The tool through which a parent's model delegates to agent ``name``."""
    spec = registry.get_agent(name)
    return ToolSpec(
        name=f"{SUBAGENT_PREFIX}{name}",
        description=f"Delegate a task to the {name} agent and get its final answer. {about(spec)}",
        parameters={
            "type": "object",
            "properties": {
                "task": {"type": "string", "description": "What the subagent should do."},
                "fork": {
                    "type": "boolean",
                    "default": False,
                    "description": "Start the subagent with a copy of this conversation.",
                },
            },
            "required": ["task"],
            "additionalProperties": False,
        },
        queue="control",
    )


def _child_request(parent: AgentSpec, call: CallRow) -> tuple[AgentSpec, str, bool]:
    name = call.tool.removeprefix(SUBAGENT_PREFIX)
    if name not in parent.subagents:
        raise InvalidRequestError(
            f"agent {parent.name!r} has no subagent {name!r}; it has {list(parent.subagents)}",
            ["tool"],
        )
    child = registry.get_agent(name)
    task, fork = call.params.get("task"), call.params.get("fork", False)
    if not isinstance(task, str) or not task.strip():
        raise InvalidRequestError("task: a non-empty string is required", ["task"])
    if not isinstance(fork, bool):
        raise InvalidRequestError("fork: a boolean is required", ["fork"])
    extra = set(call.params) - {"task", "fork"}
    if extra:
        raise InvalidRequestError(f"unexpected arguments: {sorted(extra)}", sorted(extra))
    return child, task, fork


def _check_depth(rt: Runtime, parent: ConversationRow) -> None:
    if parent.depth + 1 > rt.settings.max_depth:
        raise InvalidRequestError(
            f"subagent depth limit reached ({rt.settings.max_depth} levels below the root)",
            ["depth"],
        )


def start_child(
    rt: Runtime,
    session: Session,
    outbox: Outbox,
    call: CallRow,
    caller: tuple[TurnRow, ConversationRow, AgentSpec],
) -> list[Action]:
    """Create the child conversation and its turn; a ChorusError means the
    call is answered at once with an error result instead. ``caller``: the
    call's turn, its conversation and that conversation's agent. The caller
    holds the lock of the job's root row (:func:`~orchestrator.store.job_totals.lock_job`),
    taken before it claimed the call: the one lock order.

    The child takes a slot of the job's fan-out limit
    (:func:`~orchestrator.store.subagent_sql.child_slot`); its rows and
    events are written only if it does
    (:func:`~orchestrator.store.conversation_sql.start_conversation`).
    ``CHORUS_MAX_CHILDREN`` bounds the subagents one job starts (counted on
    the job's turn), not a conversation's lifetime: the next job on the
    same conversation starts again from zero."""
    turn, conv, spec = caller
    # A first claim (attempts 1) has no child yet; a redelivered copy may
    # find it, and then leaves before validating anything again.
    if call.attempts > 1 and has_child(session, call.id):
        return []
    child_spec, task, fork = _child_request(spec, call)
    _check_depth(rt, conv)
    job_id = turn.job_id or turn.id  # its root's row: locked by the caller
    values = new_conversation(
        conv,
        child_spec.model_dump(mode="json"),
        kind="subagent",
        state=ConversationState.RUNNING.value,
        turn_id=new_id(),
        turns=1,
        priority=conv.priority,
    )
    first = first_turn(
        values,
        task,
        context_data=turn.context_data,
        correlation_id=turn.correlation_id,  # the job's, as the parent's
        parent_call_id=call.id,
        job_id=job_id,
    )
    new = NewConversation(values, first, first_message(values["id"], first["id"], task))
    child, child_turn = new.row, new.turn_row
    outbox.record_call(
        EventName.SUBAGENT_STARTED,
        conv,
        turn,
        call,
        child_conversation_id=child.id,
        child_turn_id=child_turn.id,
        fork=fork,
    )
    outbox.record(EventName.TURN_STARTED, child, child_turn, 0, agent=child_spec.name, input=task)
    slot = child_slot(job_id, rt.settings.max_children, call.id)
    copied = conv.id if fork else None
    if start_conversation(session, new, copy_from=copied, guard=slot, events=outbox):
        return [RunStep(child.id, child_turn.id, 0, conv.priority)]
    if has_child(session, call.id):
        return []  # a redelivered copy: the child already exists
    if stop_status(session, job_id) is not None:
        raise InvalidRequestError("the job is being stopped; no new subagent", ["job"])
    raise InvalidRequestError(
        f"subagent limit reached ({rt.settings.max_children} children in this job)",
        ["children"],
    )


_ENDINGS = {
    TurnStatus.COMPLETED: EventName.SUBAGENT_COMPLETED,
    TurnStatus.FAILED: EventName.SUBAGENT_FAILED,
    TurnStatus.CANCELLED: EventName.SUBAGENT_STOPPED,
}


def answer_parent(
    session: Session, outbox: Outbox, child_turn: Turn, status: TurnStatus, answer: Any
) -> list[Action]:
    """Write the child's outcome as the parent's tool result and advance it."""
    assert child_turn.parent_call_id is not None
    is_error = status is not TurnStatus.COMPLETED
    answered = answer_call(
        session,
        child_turn.parent_call_id,
        "failed" if is_error else "completed",
        answer if not is_error else f"Error: subagent {status.value}: {answer}",
        is_error,
        utcnow(),
    )
    if answered is None:  # no such call, or it has its result already
        return []
    parent, turn, conv = answered
    outbox.record_call(
        _ENDINGS[status],
        conv,
        turn,
        parent,
        child_conversation_id=child_turn.conversation_id,
        result=answer,
    )
    return [RunAdvance(conv.id, turn.id, parent.step, parent.segment, conv.priority, if_ready=True)]
