"""``chorus.advance``: after a segment, move the cursor once (compare-and-set)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy import Row, Select, Update, bindparam, exists, null, select, update
from sqlalchemy.engine import Connection

from orchestrator.engine.actions import Action, RunSegment, RunStep, ToolTask
from orchestrator.engine.cursor import move_cursor_from, move_from
from orchestrator.engine.handoffs import handoff_in, take_over, target_values
from orchestrator.engine.tool_outputs import view
from orchestrator.runtime import Runtime
from orchestrator.store.dialect import writes_in_ctes
from orchestrator.store.fast_executor import execute
from orchestrator.store.statements import (
    insert_new,
    message_params,
    new_rows_if,
    run,
    unfinished,
)
from orchestrator.store.tables import Conversation, MessageRow, ToolCallRow, table
from schemas import ConversationState, ToolResultBlock


def advance(
    rt: Runtime, conversation_id: str, turn_id: str, step: int, segment: int
) -> list[Action]:
    """If every call of ``segment`` has its result, dispatch the next
    segment, or store the step's tool results and call the model again.

    One read (the step's calls, none while a call of the segment is still
    out) and one compare-and-set of the cursor on its position, which also
    refuses once the job is being stopped: of two racing copies exactly one
    moves it. The tool results message commits with the move, and so does
    the step's handoff, if it made one (the next step runs the target). The
    read takes no lock, so it runs on its own; on Postgres the usual end of
    a step (its last segment, no handoff) is then one statement: the move,
    the results message and the clearing of the call rows' results.
    """
    params = {
        "conversation_id": conversation_id,
        "turn_id": turn_id,
        "step": step,
        "segment": segment,
    }
    with rt.autocommit() as connection:
        calls = run(connection, _READY, params).all()
        if not calls:
            return []
        last = max(c.segment for c in calls)
        handoff = handoff_in(calls)
        if segment == last and handoff is None and writes_in_ctes(connection):
            ids = (conversation_id, turn_id, step)
            moved = _finish_step(connection, ids, segment, _results_message(ids, calls))
            return [RunStep(conversation_id, turn_id, step + 1, calls[0].priority)] if moved else []
    priority = calls[0].priority
    position = (turn_id, step, segment)
    with rt.transaction() as (session, outbox):
        if segment < last:
            if not move_cursor_from(session, conversation_id, position, cursor_segment=segment + 1):
                return []
            nxt = tuple(ToolTask(c.id, c.tool, c.queue) for c in calls if c.segment == segment + 1)
            return [RunSegment(conversation_id, turn_id, step, segment + 1, nxt, priority)]
        if not move_cursor_from(
            session,
            conversation_id,
            position,
            cursor_step=step + 1,
            cursor_segment=-1,
            **(target_values(handoff) if handoff else {}),
        ):
            return []
        if handoff:
            take_over(session, outbox, (conversation_id, turn_id, step), handoff)
        insert_new(session, (MessageRow, _results_message((conversation_id, turn_id, step), calls)))
        run(session, _CLEAR_RESULTS, {"where_turn_id": turn_id, "where_step": step})
    return [RunStep(conversation_id, turn_id, step + 1, priority)]


def _results_message(ids: tuple[str, str, int], calls: Sequence[Row[Any]]) -> dict[str, Any]:
    """The values of the step's tool results message (archived results as views)."""
    conversation_id, turn_id, step = ids
    blocks = [
        ToolResultBlock(
            tool_request_id=c.tool_request_id,
            tool=c.tool,
            result=c.result if c.view_chars is None else view(c.id, c.tool, c.result, c.view_chars),
            is_error=c.is_error,
        ).model_dump(mode="json")
        for c in calls
    ]
    return {
        "conversation_id": conversation_id,
        "turn_id": turn_id,
        "step": step,
        "kind": "tool_results",
        "role": "user",
        "content": blocks,
    }


def _finish_step(
    connection: Connection, ids: tuple[str, str, int], segment: int, message: dict[str, Any]
) -> bool:
    """Postgres: move the cursor past the step from its last ``segment``
    (the compare-and-set of :func:`move_cursor_from`) and, only if it moved,
    store the results message and clear the call rows' results: one
    statement. True if it moved. The rows are locked in the one order: the
    conversation's first (the other parts wait for its update, through
    ``moved``)."""
    conversation_id, turn_id, step = ids
    move, params = move_from(
        conversation_id, (turn_id, step, segment), cursor_step=step + 1, cursor_segment=-1
    )
    params.update(message_params(message))
    # _CLEAR_RESULTS's where_turn_id and where_step are the move's: same names, same values
    return execute(connection, _finish_statement(move), params).first() is not None


@lru_cache(maxsize=8)
def _finish_statement(move: Update) -> Select[Any]:
    """``move`` returning the conversation's id, the results message's
    INSERT (:func:`~orchestrator.store.statements.new_rows_if`) and
    :data:`_CLEAR_RESULTS`, each only for a row ``move`` returned."""
    moved = move.returning(_CONVERSATIONS.c.id).cte("moved")
    has_moved = exists(select(moved.c.id))
    message = new_rows_if(MessageRow, has_moved)
    cleared = _CLEAR_RESULTS.where(has_moved)
    return select(moved.c.id).add_cte(message.cte("stored"), cleared.cte("cleared"))


_CALLS = table(ToolCallRow)
_CONVERSATIONS = table(Conversation)
_pending = _CALLS.alias()

#: The step's calls (the columns the next segment, the results message and
#: a handoff need), each with the priority the next tasks are sent with;
#: none while a call of the segment is still out (its own advance, or the
#: sweeper, comes later) or once the cursor has moved on: with N subagents,
#: N-1 of their advances find work out, and the late ones a moved cursor,
#: and read no call. Built once, read as Core rows: it runs for every
#: call's end, and a backlog of advances can find all N calls finished
#: before the first of them has moved the cursor.
_READY = (
    select(
        _CALLS.c.id,
        _CALLS.c.segment,
        _CALLS.c.tool,
        _CALLS.c.queue,
        _CALLS.c.tool_request_id,
        _CALLS.c.params,
        _CALLS.c.result,
        _CALLS.c.view_chars,
        _CALLS.c.is_error,
        _CONVERSATIONS.c.priority,
    )
    .join(_CONVERSATIONS, _CONVERSATIONS.c.id == _CALLS.c.conversation_id)
    .where(
        _CALLS.c.turn_id == bindparam("turn_id"),
        _CALLS.c.step == bindparam("step"),
        _CONVERSATIONS.c.id == bindparam("conversation_id"),
        _CONVERSATIONS.c.state == ConversationState.RUNNING.value,
        _CONVERSATIONS.c.turn_id == bindparam("turn_id"),
        _CONVERSATIONS.c.cursor_step == bindparam("step"),
        _CONVERSATIONS.c.cursor_segment == bindparam("segment"),
        ~exists().where(
            _pending.c.turn_id == bindparam("turn_id"),
            _pending.c.step == bindparam("step"),
            _pending.c.segment == bindparam("segment"),
            unfinished(_pending.c.status),
        ),
    )
    .order_by(_CALLS.c.position)
)


#: The tool results message is now the results' one copy (docs/architecture.md,
#: Storage), but for an archived result: its row keeps it whole.
_CLEAR_RESULTS = (
    update(_CALLS)
    .where(
        _CALLS.c.turn_id == bindparam("where_turn_id"),
        _CALLS.c.step == bindparam("where_step"),
        _CALLS.c.view_chars.is_(None),
    )
    .values(result=null())
)
