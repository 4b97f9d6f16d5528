"""The tool task's two writes to its call, as statements built once.

``chorus.tool`` claims its call (one conditional UPDATE, :func:`claim`)
and stores its result (another, on Postgres with the call's events in the
same statement: :func:`record_result`). Built per call
through the ORM, these cost more worker CPU than anything else the task
does: constructing the statement, generating its cache key, and loading the
call, its turn and its conversation as ORM entities with all their JSON
columns. Built once here against the tables, with ``bindparam``s, a call
runs them with a dict of parameters, and the claim returns the store's
row types (:mod:`orchestrator.store.rows`), plain tuples.

Two reads of calls live here too: whether a segment still has a call out
(:func:`call_out`, before a turn's end sends an advance) and an archived
result (:func:`archived_result`, for ``read_tool_output``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, exists, func, select, true, update
from sqlmodel import Session

from orchestrator.events import Outbox
from orchestrator.store.db import Db, connection_of
from orchestrator.store.dialect import returns_joined_rows, writes_in_ctes
from orchestrator.store.fast_executor import execute
from orchestrator.store.rows import CallRow, ConversationRow, TurnRow, columns, take
from orchestrator.store.statements import run, unfinished
from orchestrator.store.tables import (
    AWAITING_APPROVAL,
    Conversation,
    ToolCallRow,
    Turn,
    table,
    utcnow,
)
from schemas import TurnStatus
from schemas.specs import SUBAGENT_PREFIX

#: What a tool task reads as it claims its call: the call, its turn and its
#: conversation.
Claimed = tuple[CallRow, TurnRow, ConversationRow]

_CALL = table(ToolCallRow)
_TURN = table(Turn)
_CONVERSATION = table(Conversation)
_JOB = _TURN.alias("job")

_CALL_COLUMNS = columns(CallRow, _CALL)
_TURN_COLUMNS = columns(TurnRow, _TURN)
_CONVERSATION_COLUMNS = columns(ConversationRow, _CONVERSATION)
#: The call has no result yet. The statuses are plain parameters, not an
#: expanding one (``not_in`` of a tuple): no rewriting of the SQL per run.
_UNFINISHED = unfinished(_CALL.c.status)

#: Mark the call running unless it has its result, waits for a person's
#: answer, its turn has ended, its job is being stopped, or it is a
#: subagent call: one conditional update,
#: so a redelivered copy racing the copy that finishes it cannot turn a
#: finished call back into a running one (and record a second result).
_CLAIM = (
    update(_CALL)
    .where(
        _CALL.c.id == bindparam("call_id"),
        _UNFINISHED,
        _CALL.c.status != AWAITING_APPROVAL,  # only its answer moves it on
        ~_CALL.c.tool.startswith(SUBAGENT_PREFIX, autoescape=True),
        _TURN.c.id == _CALL.c.turn_id,
        _TURN.c.status == TurnStatus.RUNNING.value,
        _JOB.c.id == func.coalesce(_TURN.c.job_id, _TURN.c.id),
        _JOB.c.stop_status.is_(None),
        _CONVERSATION.c.id == _CALL.c.conversation_id,
    )
    .values(
        status="running",
        attempts=_CALL.c.attempts + 1,
        started_at=bindparam("claimed_at"),
        task_id=bindparam("claiming_task"),
    )
)
#: The claim returning what the task reads of the call, its turn and its
#: conversation (Postgres: an ``UPDATE … FROM`` returns the joined rows).
_CLAIM_JOINED = _CLAIM.returning(*_CALL_COLUMNS, *_TURN_COLUMNS, *_CONVERSATION_COLUMNS)
#: The claim returning the call's columns only (SQLite), then its turn and
#: conversation read in one statement.
_CLAIM_CALL = _CLAIM.returning(*_CALL_COLUMNS, _CALL.c.turn_id, _CALL.c.conversation_id)
_TURN_AND_CONVERSATION = (
    select(*_TURN_COLUMNS, *_CONVERSATION_COLUMNS)
    .select_from(_TURN.join(_CONVERSATION, true()))  # two rows by key: one row
    .where(_TURN.c.id == bindparam("turn_id"), _CONVERSATION.c.id == bindparam("conversation_id"))
)

#: The call's job (its turn's, or the turn's own) has no stop mark: an
#: update of a call under these conditions changes nothing once a stop began.
JOB_NOT_STOPPING = (
    _TURN.c.id == _CALL.c.turn_id,
    _JOB.c.id == func.coalesce(_TURN.c.job_id, _TURN.c.id),
    _JOB.c.stop_status.is_(None),
)

#: The call's one result: changes no row if a result is already there or
#: its job is being stopped. A stop marks the job before it records the
#: unfinished calls ``cancelled``: a result that arrives in between (a
#: function that returned before its task saw the stop, or while the stop's
#: process died and the sweeper has yet to finish it) is dropped, so the
#: stop's mark wins and the call ends ``tool.cancelled``, never completed
#: after its job was stopped.
RESULT = (
    update(_CALL)
    .where(_CALL.c.id == bindparam("call_id"), _UNFINISHED, *JOB_NOT_STOPPING)
    .values(
        status=bindparam("result_status"),
        result=bindparam("result_value"),
        view_chars=bindparam("result_view_chars"),
        is_error=bindparam("result_is_error"),
        finished_at=bindparam("result_at"),
    )
)


def claim(db: Db, call_id: str, task_id: str | None) -> Claimed | None:
    """Claim the call (see :data:`_CLAIM`): what the task reads of it, its
    turn and its conversation, or None if the claim did not take."""
    connection = connection_of(db)
    params = {"call_id": call_id, "claimed_at": utcnow(), "claiming_task": task_id}
    if returns_joined_rows(connection):
        row = execute(connection, _CLAIM_JOINED, params).first()
        if row is None:
            return None
        call, at = take(CallRow, row)
    else:
        called = connection.execute(_CLAIM_CALL, params).first()
        if called is None:
            return None
        call, at = take(CallRow, called)
        ids = {"turn_id": called[at], "conversation_id": called[at + 1]}
        row, at = connection.execute(_TURN_AND_CONVERSATION, ids).one(), 0
    turn, at = take(TurnRow, row, at)
    conv, _ = take(ConversationRow, row, at)
    return call, turn, conv


def result_params(
    call_id: str, result: Any, is_error: bool, view_chars: int | None
) -> dict[str, Any]:
    """The parameters of :data:`RESULT`. ``view_chars``: set when the result
    is archived (the model sees a view)."""
    return {
        "call_id": call_id,
        "result_status": "failed" if is_error else "completed",
        "result_value": result,
        "result_view_chars": view_chars,
        "result_is_error": is_error,
        "result_at": utcnow(),
    }


def record_result(
    db: Db,
    call_id: str,
    answer: tuple[Any, bool, int | None],
    events: Outbox | None = None,
) -> bool:
    """Write the call's one result (:data:`RESULT`): ``answer`` is the
    result, whether it is an error, and the characters of its view when
    it is archived (the model sees a view). ``events``' pending events
    (the result's own, a ``tool.started``) are stored only if the result
    took, and dropped if not. False: the call has a result already, or
    its job is being stopped.

    Where one statement can write several tables (Postgres:
    :meth:`~orchestrator.events.Outbox.flush_if`), the result and its
    events are one statement: in an autocommit connection, one round trip.
    Elsewhere they are two statements, so ``db`` must then be a
    transaction (:func:`~orchestrator.store.dialect.write_scope` gives either)."""
    result, is_error, view_chars = answer
    params = result_params(call_id, result, is_error, view_chars)
    if events is not None and writes_in_ctes(db):
        return events.flush_if(db, RESULT, params)
    written = run(db, RESULT, params).rowcount == 1
    if events is not None:
        if written:
            events.flush(db)
        else:
            events.discard()
    return written


#: Give a claimed call back (a policy deferred it): pending again, its
#: run not counted; returns where it runs (segment, queue) and the job's
#: priority, to send it again.
_UNCLAIM = (
    update(_CALL)
    .where(_CALL.c.id == bindparam("call_id"), _CALL.c.status == "running")
    .values(status="pending", attempts=_CALL.c.attempts - 1, started_at=None, task_id=None)
    .returning(
        _CALL.c.segment,
        _CALL.c.queue,
        select(_CONVERSATION.c.priority)
        .where(_CONVERSATION.c.id == _CALL.c.conversation_id)
        .scalar_subquery(),
    )
)


def unclaim(db: Db, call_id: str) -> tuple[int, str, int] | None:
    """Give back the claim of a call that is deferred, not run: its segment,
    queue and the job's priority, or None if it is no longer running (a
    stop, or another copy, finished it)."""
    row = connection_of(db).execute(_UNCLAIM, {"call_id": call_id}).first()
    return None if row is None else (int(row[0]), str(row[1]), int(row[2]))


#: Is a call of the segment still out?
_CALL_OUT = select(
    exists().where(
        _CALL.c.turn_id == bindparam("turn_id"),
        _CALL.c.step == bindparam("step"),
        _CALL.c.segment == bindparam("segment"),
        _UNFINISHED,
    )
)


def call_out(db: Db, turn_id: str, step: int, segment: int) -> bool:
    """Is a call of this segment of the turn's step still unfinished?"""
    params = {"turn_id": turn_id, "step": step, "segment": segment}
    return bool(run(db, _CALL_OUT, params).scalar())


def archived_result(session: Session, root_id: str, handle: str) -> Any:
    """The (result,) of call ``handle`` if the tree ``root_id`` holds it
    archived (a view of it was given to the model); None otherwise."""
    return session.execute(
        select(_CALL.c.result)
        .join(_CONVERSATION, _CONVERSATION.c.id == _CALL.c.conversation_id)
        .where(
            _CALL.c.id == handle,
            _CONVERSATION.c.root_id == root_id,
            _CALL.c.view_chars.is_not(None),
        )
    ).first()
