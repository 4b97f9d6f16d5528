"""The tool task's two writes to its call, as statements built once.

``chorus.tool`` claims its call (one conditional UPDATE) and stores its
result (another, on Postgres with the call's events in the same
statement, :meth:`orchestrator.events.Outbox.flush_if`). Built per call
through the ORM, these cost more worker CPU than anything else the task
does: constructing the statement, generating its cache key, and loading the
call, its turn and its conversation as ORM entities with all their JSON
columns. Built once here against the tables, with ``bindparam``s, a call
runs them with a dict of parameters, and the claim returns only the
columns the task reads, as plain tuples.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from sqlalchemy import bindparam, func, select, true, update

from orchestrator.store.db import Db, connection_of
from orchestrator.store.dialect import returns_joined_rows
from orchestrator.store.fast_executor import execute
from orchestrator.store.statements import unfinished
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


class CallFields(Protocol):
    """What the tool task reads of its call: a claimed call's columns, or
    the row (a subagent call)."""

    @property
    def id(self) -> str: ...
    @property
    def tool(self) -> str: ...
    @property
    def tool_request_id(self) -> str: ...
    @property
    def params(self) -> dict[str, Any]: ...
    @property
    def attempts(self) -> int: ...
    @property
    def step(self) -> int: ...


class TurnFields(Protocol):
    """What the tool task reads of the call's turn (its events' ids, too:
    :class:`orchestrator.events.TurnIds`)."""

    @property
    def id(self) -> str: ...
    @property
    def correlation_id(self) -> str: ...

    @property
    def context_data(self) -> dict[str, Any]: ...


class ConversationFields(Protocol):
    """What the tool task reads of the call's conversation (its events'
    ids, too: :class:`orchestrator.events.ConversationIds`)."""

    @property
    def id(self) -> str: ...
    @property
    def root_id(self) -> str: ...

    @property
    def agent_spec(self) -> dict[str, Any]: ...


class ClaimedCall(NamedTuple):
    id: str
    tool: str
    tool_request_id: str
    params: dict[str, Any]
    attempts: int
    step: int
    answer: str | None  # a person's answer to a call that needed one


class ClaimedTurn(NamedTuple):
    id: str
    correlation_id: str
    context_data: dict[str, Any]


class ClaimedConversation(NamedTuple):
    id: str
    root_id: str
    agent_spec: dict[str, Any]


Claimed = tuple[ClaimedCall, ClaimedTurn, ClaimedConversation]

_CALL = table(ToolCallRow)
_TURN = table(Turn)
_CONVERSATION = table(Conversation)
_JOB = _TURN.alias("job")

_CALL_COLUMNS = [_CALL.c[name] for name in ClaimedCall._fields]
_TURN_COLUMNS = [_TURN.c[name] for name in ClaimedTurn._fields]
_CONVERSATION_COLUMNS = [_CONVERSATION.c[name] for name in ClaimedConversation._fields]
_CALL_END = len(_CALL_COLUMNS)
#: The call has no result yet. The statuses are plain parameters, not an
#: expanding one (``not_in`` of a tuple): no rewriting of the SQL per run.
_UNFINISHED = unfinished(_CALL.c.status)
_TURN_END = _CALL_END + len(_TURN_COLUMNS)

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
        return (
            ClaimedCall(*row[:_CALL_END]),
            ClaimedTurn(*row[_CALL_END:_TURN_END]),
            ClaimedConversation(*row[_TURN_END:]),
        )
    called = connection.execute(_CLAIM_CALL, params).first()
    if called is None:
        return None
    found = connection.execute(
        _TURN_AND_CONVERSATION,
        {"turn_id": called.turn_id, "conversation_id": called.conversation_id},
    ).one()
    split = len(_TURN_COLUMNS)
    return (
        ClaimedCall(*called[:_CALL_END]),
        ClaimedTurn(*found[:split]),
        ClaimedConversation(*found[split:]),
    )


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
