"""A subagent call's reads and writes, as statements built once.

Every child of a fan-out costs its parent's call a read and a claim (its
start, ``chorus.tool``) and a result (its end, ``answer_parent``). Built
per call through the ORM, with the call, its turn and its conversation
loaded as entities (all their JSON columns), these were most of a child's
start. Built once here against the tables, with ``bindparam``s, they run
with a dict of parameters and return only the columns that are read, as
plain tuples (:mod:`orchestrator.store.statements`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import bindparam, exists, func, select, true, update
from sqlmodel import Session

from orchestrator.store.dialect import returns_joined_rows
from orchestrator.store.job_totals import LOCK_JOB, lock_job
from orchestrator.store.statements import run, unfinished
from orchestrator.store.tables import Conversation, ToolCallRow, Turn, table, utcnow
from orchestrator.store.tool_call_sql import ClaimedCall


class SubagentCall(NamedTuple):
    """What a subagent call's start reads of the call."""

    id: str
    tool: str
    tool_request_id: str
    params: dict[str, Any]
    attempts: int
    step: int
    status: str


class CallerTurn(NamedTuple):
    """What a child's start reads of the turn that called it, and whether
    that turn's job is being stopped (``job_stop_status``)."""

    id: str
    correlation_id: str
    context_data: dict[str, Any]
    job_id: str | None
    status: str
    job_stop_status: str | None


class CallerConversation(NamedTuple):
    """What a child's start reads of the conversation that called it."""

    id: str
    root_id: str
    agent_spec: dict[str, Any]
    depth: int
    priority: int


class ConversationRef(NamedTuple):
    """A conversation's ids, as its events name them."""

    id: str
    root_id: str


class TurnEventRef(NamedTuple):
    """A turn's ids, as its events name them."""

    id: str
    correlation_id: str


class Answered(NamedTuple):
    """A subagent call that took its child's outcome as its result: what
    the parent's event and its advance need."""

    conversation: ConversationRef
    turn: TurnEventRef
    priority: int
    step: int
    segment: int
    tool: str
    tool_request_id: str


_CALLS = table(ToolCallRow)
_TURNS = table(Turn)
_CONVERSATIONS = table(Conversation)
_JOBS = _TURNS.alias("job")


def _columns(found: Any, fields: tuple[str, ...]) -> list[Any]:
    return [found.c[name] for name in fields]


_CALLER_TURN_COLUMNS = CallerTurn._fields[:-1]
_SPLIT = (len(SubagentCall._fields), len(SubagentCall._fields) + len(CallerTurn._fields))

#: The call, its turn, its job's stop mark and its conversation, in one
#: read (no lock: the claim that follows is the conditional update).
_READ = (
    select(
        *_columns(_CALLS, SubagentCall._fields),
        *_columns(_TURNS, _CALLER_TURN_COLUMNS),
        _JOBS.c.stop_status,
        *_columns(_CONVERSATIONS, CallerConversation._fields),
    )
    .select_from(
        _CALLS.join(_TURNS, _TURNS.c.id == _CALLS.c.turn_id)
        .join(_CONVERSATIONS, _CONVERSATIONS.c.id == _CALLS.c.conversation_id)
        .outerjoin(_JOBS, _JOBS.c.id == func.coalesce(_TURNS.c.job_id, _TURNS.c.id))
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
    .returning(*_columns(_CALLS, ClaimedCall._fields))
)


def _of_call(column: Any, key: Any) -> Any:
    """``column`` of the row whose id is the call's ``key``: a scalar
    subquery in the answer's RETURNING (Postgres)."""
    return select(column).where(column.table.c.id == key).scalar_subquery()


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
_ANSWER_END = ("step", "segment", "tool", "tool_request_id")
#: The result returning what the parent's event and its advance need, the
#: parent's ids and priority read in the same statement (Postgres).
_ANSWER = _RESULT.returning(
    _CALLS.c.conversation_id,
    _of_call(_CONVERSATIONS.c.root_id, _CALLS.c.conversation_id),
    _CALLS.c.turn_id,
    _of_call(_TURNS.c.correlation_id, _CALLS.c.turn_id),
    _of_call(_CONVERSATIONS.c.priority, _CALLS.c.conversation_id),
    *_columns(_CALLS, _ANSWER_END),
)
#: SQLite renders RETURNING without table names, so a subquery there
#: cannot name the call's columns: the result returns the call's, then the
#: parent's are one read.
_ANSWER_CALL = _RESULT.returning(
    _CALLS.c.conversation_id, _CALLS.c.turn_id, *_columns(_CALLS, _ANSWER_END)
)
_PARENT = (
    select(_CONVERSATIONS.c.root_id, _TURNS.c.correlation_id, _CONVERSATIONS.c.priority)
    .select_from(_CONVERSATIONS.join(_TURNS, true()))  # two rows by key: one row
    .where(
        _CONVERSATIONS.c.id == bindparam("conversation_id"),
        _TURNS.c.id == bindparam("turn_id"),
    )
)


def read_call(
    session: Session, call_id: str
) -> tuple[SubagentCall, CallerTurn, CallerConversation] | None:
    """The call, its turn (with its job's stop mark) and its conversation."""
    row = run(session, _READ, {"call_id": call_id}).first()
    if row is None:
        return None
    first, second = _SPLIT
    return (
        SubagentCall(*row[:first]),
        CallerTurn(*row[first:second]),
        CallerConversation(*row[second:]),
    )


#: The claim, the job's root row locked first (Postgres: a CTE the claim's
#: condition waits on, so it runs before the claim touches the call).
_CLAIM_LOCKED = _CLAIM.where(exists(select(LOCK_JOB.cte("locked").c.id)))


def claim_call(
    session: Session, call_id: str, task_id: str | None, job_id: str
) -> ClaimedCall | None:
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
    return None if row is None else ClaimedCall._make(row)


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
        values: tuple[Any, ...] = tuple(row)
    else:
        called = run(session, _ANSWER_CALL, params).first()
        if called is None:
            return None
        conversation_id, turn_id, *rest = tuple(called)
        ids = {"conversation_id": conversation_id, "turn_id": turn_id}
        parent: tuple[Any, ...] = tuple(run(session, _PARENT, ids).one())
        root_id, correlation_id, priority = parent
        values = (conversation_id, root_id, turn_id, correlation_id, priority, *rest)
    conversation, turn = ConversationRef(*values[0:2]), TurnEventRef(*values[2:4])
    return Answered._make((conversation, turn, *values[4:]))
