"""A subagent call's reads and writes, as statements built once.

Every child of a fan-out costs its parent's call a read and a claim (its
start, ``chorus.tool``) and a result (its end, ``answer_parent``). Built
per call through the ORM, with the call, its turn and its conversation
loaded as entities (all their JSON columns), these were most of a child's
start. Built once here against the tables, with ``bindparam``s, they run
with a dict of parameters and return the store's row types
(:mod:`orchestrator.store.rows`), plain tuples. The child's own rows are
written by :func:`orchestrator.store.conversation_sql.start_conversation`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import bindparam, exists, func, select, true, update
from sqlmodel import Session

from orchestrator.store.conversation_sql import Guard
from orchestrator.store.dialect import returns_joined_rows
from orchestrator.store.job_totals import LOCK_JOB, lock_job
from orchestrator.store.rows import CallRow, ConversationRow, TurnRow, columns, take
from orchestrator.store.statements import run, unfinished
from orchestrator.store.tables import Conversation, ToolCallRow, Turn, table, utcnow


class Answered(NamedTuple):
    """A subagent call that took its child's outcome as its result: the
    call, its turn and its conversation (the parent's event and advance)."""

    call: CallRow
    turn: TurnRow
    conversation: ConversationRow


#: A subagent call as its start reads it: the call, its turn, its
#: conversation and its job's turn (its stop mark).
Caller = tuple[CallRow, TurnRow, ConversationRow, TurnRow]

_CALLS = table(ToolCallRow)
_TURNS = table(Turn)
_CONVERSATIONS = table(Conversation)
_JOBS = _TURNS.alias("job")


#: The call, its turn, its conversation and its job's turn, in one read (no
#: lock: the claim that follows is the conditional update).
_READ = (
    select(
        *columns(CallRow, _CALLS),
        *columns(TurnRow, _TURNS),
        *columns(ConversationRow, _CONVERSATIONS),
        *columns(TurnRow, _JOBS),
    )
    .select_from(
        _CALLS.join(_TURNS, _TURNS.c.id == _CALLS.c.turn_id)
        .join(_CONVERSATIONS, _CONVERSATIONS.c.id == _CALLS.c.conversation_id)
        .join(_JOBS, _JOBS.c.id == func.coalesce(_TURNS.c.job_id, _TURNS.c.id))
    )
    .where(_CALLS.c.id == bindparam("call_id"))
)

#: Mark the call running unless it has its result: a conditional update,
#: so of racing copies only those that find it unfinished go on (and the
#: child's unique ``parent_call_id`` keeps to one child).
_CLAIM = (
    update(_CALLS)
    .where(_CALLS.c.id == bindparam("call_id"), unfinished(_CALLS.c.status))
    .values(
        status="running",
        attempts=_CALLS.c.attempts + 1,
        started_at=bindparam("claimed_at"),
        task_id=bindparam("claiming_task"),
    )
    .returning(*columns(CallRow, _CALLS))
)


#: The call's one result (none if it has one already).
_RESULT = (
    update(_CALLS)
    .where(_CALLS.c.id == bindparam("call_id"), unfinished(_CALLS.c.status))
    .values(
        {
            key: bindparam(f"set_{key}", type_=_CALLS.c[key].type)
            for key in ("status", "result", "is_error", "finished_at")
        }
    )
)
#: The result returning the call, its turn and its conversation (Postgres:
#: an ``UPDATE … FROM`` returns the joined rows; they are not locked).
_ANSWER = _RESULT.where(
    _TURNS.c.id == _CALLS.c.turn_id, _CONVERSATIONS.c.id == _CALLS.c.conversation_id
).returning(
    *columns(CallRow, _CALLS),
    *columns(TurnRow, _TURNS),
    *columns(ConversationRow, _CONVERSATIONS),
)
#: SQLite's RETURNING cannot name joined tables: the result returns the
#: call's columns, then its turn and conversation are one read.
_ANSWER_CALL = _RESULT.returning(
    *columns(CallRow, _CALLS), _CALLS.c.turn_id, _CALLS.c.conversation_id
)
_PARENT = (
    select(*columns(TurnRow, _TURNS), *columns(ConversationRow, _CONVERSATIONS))
    .select_from(_TURNS.join(_CONVERSATIONS, true()))  # two rows by key: one row
    .where(
        _TURNS.c.id == bindparam("turn_id"),
        _CONVERSATIONS.c.id == bindparam("conversation_id"),
    )
)


def read_call(session: Session, call_id: str) -> Caller | None:
    """The call, its turn, its conversation and its job's turn."""
    row = run(session, _READ, {"call_id": call_id}).first()
    if row is None:
        return None
    call, at = take(CallRow, row)
    turn, at = take(TurnRow, row, at)
    conv, at = take(ConversationRow, row, at)
    job, _ = take(TurnRow, row, at)
    return call, turn, conv, job


#: The claim, the job's root row locked first (Postgres: a CTE the claim's
#: condition waits on, so it runs before the claim touches the call).
_CLAIM_LOCKED = _CLAIM.where(exists(select(LOCK_JOB.cte("locked").c.id)))


def claim_call(session: Session, call_id: str, task_id: str | None, job_id: str) -> CallRow | None:
    """Lock the root row of the job ``job_id``
    (:func:`~orchestrator.store.job_totals.lock_job`), then mark the call
    running, in the session's transaction: one statement on Postgres. None
    if the call has its result already."""
    params = {
        "call_id": call_id,
        "claimed_at": utcnow(),
        "claiming_task": task_id,
        "b_job": job_id,
    }
    if returns_joined_rows(session):
        row = run(session, _CLAIM_LOCKED, params).first()
    else:
        lock_job(session, job_id)
        row = run(session, _CLAIM, params).first()
    return None if row is None else take(CallRow, row)[0]


def answer_call(
    session: Session, call_id: str, status: str, result: Any, is_error: bool, at: datetime
) -> Answered | None:
    """Write the call's one result; None if it has one already (or no
    such call)."""
    params = {
        "call_id": call_id,
        "set_status": status,
        "set_result": result,
        "set_is_error": is_error,
        "set_finished_at": at,
    }
    if returns_joined_rows(session):
        row = run(session, _ANSWER, params).first()
        if row is None:
            return None
        call, end = take(CallRow, row)
    else:
        called = run(session, _ANSWER_CALL, params).first()
        if called is None:
            return None
        call, end = take(CallRow, called)
        ids = {"turn_id": called[end], "conversation_id": called[end + 1]}
        row, end = run(session, _PARENT, ids).one(), 0
    turn, end = take(TurnRow, row, end)
    conv, _ = take(ConversationRow, row, end)
    return Answered(call, turn, conv)


_CHILDREN = _TURNS.alias("child")

#: The child of a subagent call, if it was started already.
_CHILD_OF = select(_CHILDREN.c.id).where(_CHILDREN.c.parent_call_id == bindparam("call_id"))

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

_STOP_STATUS = select(_TURNS.c.stop_status).where(_TURNS.c.id == bindparam("job_id"))


def child_slot(job_id: str, max_children: int, call_id: str) -> Guard:
    """The guard of a child's start
    (:func:`~orchestrator.store.conversation_sql.start_conversation`): one
    more child of the job ``job_id`` within ``max_children`` (counted on the
    job's turn), unless the job is being stopped or the call ``call_id`` has
    its child already."""
    return _TAKE_SLOT, {"where_id": job_id, "max_children": max_children, "call_id": call_id}


def has_child(session: Session, call_id: str) -> bool:
    """Was the child of call ``call_id`` started already?"""
    return run(session, _CHILD_OF, {"call_id": call_id}).first() is not None


def stop_status(session: Session, job_id: str) -> str | None:
    """The stop mark of the job ``job_id`` (None: not being stopped)."""
    found = run(session, _STOP_STATUS, {"job_id": job_id}).first()
    return None if found is None else found[0]
