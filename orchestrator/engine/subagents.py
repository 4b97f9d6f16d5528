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

from sqlalchemy import ColumnElement, Insert, bindparam, exists, select, update
from sqlmodel import Session

from orchestrator import registry
from orchestrator.engine.actions import Action, RunAdvance, RunStep
from orchestrator.engine.history import copy_messages
from orchestrator.errors import InvalidRequestError
from orchestrator.events import Outbox
from orchestrator.runtime import Runtime
from orchestrator.store.dialect import writes_in_ctes
from orchestrator.store.statements import insert_new, new_row_params, new_rows_if, run
from orchestrator.store.subagent_sql import (
    CallerConversation,
    CallerTurn,
    ConversationRef,
    TurnEventRef,
    answer_call,
)
from orchestrator.store.tables import Conversation, MessageRow, Turn, new_id, table, utcnow
from orchestrator.store.tool_call_sql import CallFields
from schemas import AgentSpec, ConversationState, EventName, TextBlock, ToolSpec, TurnStatus
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


def _child_request(parent: AgentSpec, call: CallFields) -> tuple[AgentSpec, str, bool]:
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


def _check_depth(rt: Runtime, parent: CallerConversation) -> None:
    if parent.depth + 1 > rt.settings.max_depth:
        raise InvalidRequestError(
            f"subagent depth limit reached ({rt.settings.max_depth} levels below the root)",
            ["depth"],
        )


def _insert_child(
    rt: Runtime,
    session: Session,
    outbox: Outbox,
    job_id: str,
    child: tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]],
    fork: bool,
) -> bool:
    """Count the child of call ``call_id`` (the first of ``child``) against
    the job's fan-out limit and, if it took a slot, insert its conversation,
    turn and first message (the rest of ``child``) and store the outbox's
    events: on Postgres one statement (the slot's update first: the job's
    turn is locked before any new row). A ``fork`` copies the parent's
    messages once the slot is taken, before the child's rows (the
    history's order): the slot is then a statement of its own. False if
    the call has its child already (a redelivered copy): nothing is
    written. ``outbox`` holds the child's events only: they are dropped
    when no slot is taken.

    ``CHORUS_MAX_CHILDREN`` bounds the subagents one job starts (counted on
    the job's turn), not a conversation's lifetime: the next job on the
    same conversation starts again from zero.
    """
    call_id, conversation, first_turn, message = child
    params = {"where_id": job_id, "max_children": rt.settings.max_children, "call_id": call_id}
    rows = ((Conversation, conversation), (Turn, first_turn), (MessageRow, message))
    if writes_in_ctes(session) and not fork:
        params.update(new_row_params(rows))
        taken = outbox.flush_if(session, _TAKE_SLOT, params, _child_rows)
    else:
        taken = run(session, _TAKE_SLOT, params).rowcount == 1
        if taken:
            if fork:
                copy_messages(session, conversation["parent_id"], conversation["id"])
            insert_new(session, *rows)
        else:
            outbox.discard()
    if taken:
        return True
    if run(session, _CHILD_OF, {"call_id": call_id}).first():
        return False
    job = session.get(Turn, job_id)
    if job is not None and job.stop_status is not None:
        raise InvalidRequestError("the job is being stopped; no new subagent", ["job"])
    raise InvalidRequestError(
        f"subagent limit reached ({rt.settings.max_children} children in this job)",
        ["children"],
    )


def start_child(
    rt: Runtime,
    session: Session,
    outbox: Outbox,
    call: CallFields,
    caller: tuple[CallerTurn, CallerConversation, AgentSpec],
) -> list[Action]:
    """Create the child conversation and its turn; a ChorusError means the
    call is answered at once with an error result instead. ``caller``: the
    call's turn, its conversation and that conversation's agent. The caller
    holds the lock of the job's root row (:func:`~orchestrator.store.job_totals.lock_job`),
    taken before it claimed the call: the one lock order.

    The child's rows are inserted from their values (no entities: nothing
    reads them in this transaction)."""
    turn, conv, spec = caller
    # A first claim (attempts 1) has no child yet; a redelivered copy may
    # find it, and then leaves before validating anything again.
    if call.attempts > 1 and run(session, _CHILD_OF, {"call_id": call.id}).first():
        return []
    child_spec, task, fork = _child_request(spec, call)
    _check_depth(rt, conv)
    child = ConversationRef(new_id(), conv.root_id)
    child_turn = TurnEventRef(new_id(), turn.correlation_id)  # the job's, as the parent's
    conversation = {
        "id": child.id,
        "root_id": conv.root_id,
        "parent_id": conv.id,
        "depth": conv.depth + 1,
        "kind": "subagent",
        "agent": child_spec.name,
        "agent_spec": child_spec.model_dump(mode="json"),
        "state": ConversationState.RUNNING.value,
        "turn_id": child_turn.id,
        "turns": 1,
        "priority": conv.priority,
    }
    first_turn = {
        "id": child_turn.id,
        "conversation_id": child.id,
        "root_id": conv.root_id,
        "number": 0,
        "agent": child_spec.name,
        "input_text": task,
        "context_data": turn.context_data,
        "correlation_id": child_turn.correlation_id,
        "parent_call_id": call.id,
        "job_id": turn.job_id or turn.id,
    }
    message = {
        "conversation_id": child.id,
        "turn_id": child_turn.id,
        "step": 0,
        "kind": "input",
        "role": "user",
        "content": [TextBlock(text=task).model_dump()],
    }
    outbox.record(
        EventName.SUBAGENT_STARTED,
        conv,
        turn,
        call.step,
        tool=call.tool,
        tool_request_id=call.tool_request_id,
        child_conversation_id=child.id,
        child_turn_id=child_turn.id,
        fork=fork,
    )
    outbox.record(EventName.TURN_STARTED, child, child_turn, 0, agent=child_spec.name, input=task)
    job_id = turn.job_id or turn.id  # its root's row: locked by the caller
    rows = (call.id, conversation, first_turn, message)
    if not _insert_child(rt, session, outbox, job_id, rows, fork):
        return []  # a redelivered copy: the child already exists
    return [RunStep(child.id, child_turn.id, 0, conv.priority)]


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
    call = answer_call(
        session,
        child_turn.parent_call_id,
        "failed" if is_error else "completed",
        answer if not is_error else f"Error: subagent {status.value}: {answer}",
        is_error,
        utcnow(),
    )
    if call is None:  # no such call, or it has its result already
        return []
    outbox.record(
        _ENDINGS[status],
        call.conversation,
        call.turn,
        call.step,
        tool=call.tool,
        tool_request_id=call.tool_request_id,
        child_conversation_id=child_turn.conversation_id,
        result=answer,
    )
    conversation_id, turn_id = call.conversation.id, call.turn.id
    return [
        RunAdvance(conversation_id, turn_id, call.step, call.segment, call.priority, if_ready=True)
    ]


_TURNS = table(Turn)

#: The child of a subagent call, if it was started already.
_CHILD_OF = select(_TURNS.c.id).where(_TURNS.c.parent_call_id == bindparam("call_id"))
_CHILDREN = _TURNS.alias("child")


def _child_rows(taken: ColumnElement[bool]) -> tuple[Insert, ...]:
    """The child's conversation, turn and first message, each inserted only
    if ``taken`` (its slot was): the riders of :func:`_insert_child`'s
    statement."""
    return tuple(new_rows_if(model, taken) for model in (Conversation, Turn, MessageRow))


#: One more child for the job, within the fan-out limit, unless it is being
#: stopped (a stop marked since the call was read: no new child, as the
#: stop could otherwise end the job's turn before this child) or the call
#: has its child already.
_TAKE_SLOT = (
    update(_TURNS)
    .where(
        _TURNS.c.id == bindparam("where_id"),
        _TURNS.c.tree_children < bindparam("max_children"),
        _TURNS.c.stop_status.is_(None),
        ~exists().where(_CHILDREN.c.parent_call_id == bindparam("call_id")),
    )
    .values(tree_children=_TURNS.c.tree_children + 1)
)
