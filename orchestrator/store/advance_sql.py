"""``chorus.advance``'s reads and writes, as statements built once.

The step's calls once its segment is done (:func:`ready_calls`), and the
usual end of a step (:func:`finish_step`): the cursor's move past it, its
tool results message and the clearing of its call rows' results, in one
statement where the database can (:func:`clear_results` elsewhere).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from sqlalchemy import Row, Select, Update, bindparam, exists, null, select, update
from sqlmodel import Session

from orchestrator.store.cursor_sql import move_from, move_from_position
from orchestrator.store.db import Db, connection_of
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
from schemas import ConversationState


def ready_calls(db: Db, ids: tuple[str, str, int], segment: int) -> list[Row[Any]]:
    """The calls of step ``ids`` (conversation, turn, step) with what the
    next segment, the results message and a handoff need, each with the
    conversation's priority; none while a call of ``segment`` is out or
    once the cursor has left it (:data:`_READY`)."""
    conversation_id, turn_id, step = ids
    params = {
        "conversation_id": conversation_id,
        "turn_id": turn_id,
        "step": step,
        "segment": segment,
    }
    return run(db, _READY, params).all()


def clear_results(session: Session, turn_id: str, step: int) -> None:
    """Clear the results of the step's call rows but the archived ones:
    its tool results message, stored with it, is now their one copy."""
    run(session, _CLEAR_RESULTS, {"where_turn_id": turn_id, "where_step": step})


def finish_step(db: Db, ids: tuple[str, str, int], segment: int, message: dict[str, Any]) -> bool:
    """Move the cursor past the step from its last ``segment`` (the
    compare-and-set of :func:`~orchestrator.store.cursor_sql.move_from_position`)
    and, only if it moved, store the results ``message`` and clear the call
    rows' results. True if it moved.

    Where one statement can write several tables (Postgres:
    :func:`~orchestrator.store.dialect.writes_in_ctes`) the three are one
    statement, in an autocommit connection one round trip; the rows are
    locked in the one order, the conversation's first (the other parts wait
    for its update, through ``moved``). Elsewhere they are three statements,
    so ``db`` must then be a transaction
    (:func:`~orchestrator.store.dialect.write_scope` gives either)."""
    conversation_id, turn_id, step = ids
    position = (turn_id, step, segment)
    if not writes_in_ctes(db):
        assert isinstance(db, Session)
        if not move_from_position(
            db, conversation_id, position, cursor_step=step + 1, cursor_segment=-1
        ):
            return False
        insert_new(db, (MessageRow, message))
        clear_results(db, turn_id, step)
        return True
    move, params = move_from(conversation_id, position, cursor_step=step + 1, cursor_segment=-1)
    params.update(message_params(message))
    # _CLEAR_RESULTS's where_turn_id and where_step are the move's: same names, same values
    return execute(connection_of(db), _finish_statement(move), params).first() is not None


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
