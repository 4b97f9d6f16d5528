"""Human approvals' reads and writes on the tool call table, built once.

A gated call goes ``running`` (claimed by its tool task) → ``awaiting``
(:data:`AWAIT`); a person's answer is one compare-and-set from
``awaiting`` (:data:`ANSWER`): approved → ``approved`` (claimable:
its tool task runs it), denied → ``failed`` with the denial as its result.
Of two answers exactly one changes the row. The statements are Core and take
a plain connection or a session: an asyncio caller runs the functions here in
``AsyncConnection.run_sync`` / ``AsyncSession.run_sync``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Float, Row, bindparam, func, select, update
from sqlmodel import Session

from orchestrator.store.clock import db_now
from orchestrator.store.db import Db
from orchestrator.store.statements import run
from orchestrator.store.tables import (
    APPROVED,
    AWAITING_APPROVAL,
    Conversation,
    ToolCallRow,
    Turn,
    table,
    utcnow,
)
from orchestrator.store.tool_call_sql import JOB_NOT_STOPPING
from schemas import Decision, PendingApproval

_CALL = table(ToolCallRow)
_TURN = table(Turn)
_CONVERSATION = table(Conversation)
_TIMEOUT = bindparam("timeout", type_=Float)

#: The claimed (``running``) call starts waiting for an answer: not a run
#: (``attempts`` back to 0), the deadline on the database's clock (NULL
#: without a timeout). Changes nothing once answered or no longer running.
AWAIT = (
    update(_CALL)
    .where(
        _CALL.c.id == bindparam("call_id"),
        _CALL.c.status == "running",
        _CALL.c.answer.is_(None),
    )
    .values(
        status=AWAITING_APPROVAL,
        attempts=0,
        started_at=None,
        approval_requested_at=db_now(),
        approval_deadline=db_now(_TIMEOUT),
    )
)

#: The one answer: only a call still waiting, whose job is not being
#: stopped (a stop records it ``cancelled``), changes.
ANSWER = (
    update(_CALL)
    .where(
        _CALL.c.id == bindparam("call_id"),
        _CALL.c.status == AWAITING_APPROVAL,
        *JOB_NOT_STOPPING,
    )
    .values(
        status=bindparam("new_status"),
        answer=bindparam("decision"),
        answered_by=bindparam("by"),
        answered_at=db_now(),
        answer_note=bindparam("note"),
        result=bindparam("result_value"),
        is_error=bindparam("result_is_error"),
        finished_at=bindparam("result_at"),
    )
)


class CallState(NamedTuple):
    """What an answer needs of its call: where it is, and its state."""

    id: str
    status: str
    answer: str | None
    answered_by: str | None
    tool: str
    tool_request_id: str
    queue: str
    step: int
    segment: int
    conversation_id: str
    root_id: str
    turn_id: str
    correlation_id: str
    priority: int
    approval_requested_at: datetime | None
    approval_deadline: datetime | None


_STATE = (
    select(
        _CALL.c.id,
        _CALL.c.status,
        _CALL.c.answer,
        _CALL.c.answered_by,
        _CALL.c.tool,
        _CALL.c.tool_request_id,
        _CALL.c.queue,
        _CALL.c.step,
        _CALL.c.segment,
        _CALL.c.conversation_id,
        _CONVERSATION.c.root_id,
        _CALL.c.turn_id,
        _TURN.c.correlation_id,
        _CONVERSATION.c.priority,
        _CALL.c.approval_requested_at,
        _CALL.c.approval_deadline,
    )
    .join(_TURN, _TURN.c.id == _CALL.c.turn_id)
    .join(_CONVERSATION, _CONVERSATION.c.id == _CALL.c.conversation_id)
    .where(_CALL.c.id == bindparam("call_id"))
)


def call_state(db: Db, call_id: str) -> CallState | None:
    """The call's state and where it is; None: no such call."""
    row = run(db, _STATE, {"call_id": call_id}).first()
    return CallState(*row) if row is not None else None


def start_waiting(db: Db, call_id: str, timeout: float | None) -> bool:
    """:data:`AWAIT`; True if this statement moved the call to waiting."""
    moved = run(db, AWAIT, {"call_id": call_id, "timeout": timeout})
    return bool(moved.rowcount == 1)


def record_answer(
    db: Db, call_id: str, decision: Decision, by: str, note: str | None, result: str | None
) -> bool:
    """:data:`ANSWER`; True if this answer is the one. A denial stores
    ``result`` (the error the model sees) and finishes the call."""
    denied = decision is Decision.DENIED
    params: dict[str, Any] = {
        "call_id": call_id,
        "new_status": "failed" if denied else APPROVED,
        "decision": decision.value,
        "by": by,
        "note": note,
        "result_value": result,
        "result_is_error": denied,
        "result_at": utcnow() if denied else None,
    }
    return bool(run(db, ANSWER, params).rowcount == 1)


def pending_calls(
    session: Session,
    conversation_id: str | None,
    agent: str | None,
    tool: str | None,
    limit: int,
    tenant: str | None = None,
) -> list[PendingApproval]:
    """The calls waiting for an answer, oldest first, filtered: by the
    conversation that made the call or its tree's root, by the agent of
    that conversation, by tool, by the tenant of the tree's root."""
    query = (
        select(
            _CALL.c.id,
            func.coalesce(_TURN.c.job_id, _TURN.c.id),
            _CALL.c.conversation_id,
            _CONVERSATION.c.root_id,
            _CONVERSATION.c.agent,
            _CALL.c.tool,
            _CALL.c.params,
            _CALL.c.approval_requested_at,
            _CALL.c.approval_deadline,
        )
        .join(_TURN, _TURN.c.id == _CALL.c.turn_id)
        .join(_CONVERSATION, _CONVERSATION.c.id == _CALL.c.conversation_id)
        .where(_CALL.c.status == AWAITING_APPROVAL)
        .order_by(_CALL.c.approval_requested_at, _CALL.c.id)
        .limit(limit)
    )
    if conversation_id is not None:
        query = query.where(
            (_CALL.c.conversation_id == conversation_id)
            | (_CONVERSATION.c.root_id == conversation_id)
        )
    if agent is not None:
        query = query.where(_CONVERSATION.c.agent == agent)
    if tool is not None:
        query = query.where(_CALL.c.tool == tool)
    if tenant is not None:
        owned = select(_CONVERSATION.c.id).where(_CONVERSATION.c.tenant == tenant)
        query = query.where(_CONVERSATION.c.root_id.in_(owned))
    return [_pending_record(row) for row in session.execute(query).all()]


def _pending_record(row: Row[Any]) -> PendingApproval:
    """A row of :func:`pending_calls`' query as its typed record."""
    call_id, job_id, conversation_id, root_id, agent, tool, params, requested, deadline = tuple(row)
    return PendingApproval(
        call_id=call_id,
        job_id=job_id,
        conversation_id=conversation_id,
        root_id=root_id,
        agent=agent,
        tool=tool,
        arguments=params or {},
        requested_at=requested,
        deadline=deadline,
    )


#: Calls whose wait passed its deadline (the database's clock), oldest first.
_EXPIRED = (
    select(_CALL.c.id)
    .where(_CALL.c.status == AWAITING_APPROVAL, _CALL.c.approval_deadline <= db_now())
    .order_by(_CALL.c.approval_deadline)
    .limit(bindparam("limit"))
)


def expired_calls(db: Db, limit: int) -> list[str]:
    """Ids of the calls whose wait for an answer is over."""
    return [row[0] for row in run(db, _EXPIRED, {"limit": limit}).all()]
