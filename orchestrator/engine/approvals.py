"""Durable human approvals: a tool call that waits for a person's answer.

A call needs approval when its tool was declared with ``approval=True`` or
its agent lists the tool in ``approve`` (:func:`gate`). Its ``chorus.tool``
task claims it as usual, finds it gated and unanswered, moves it to
``awaiting`` with ``tool.approval_requested`` (:func:`hold`) and
returns: the task ends, no worker slot waits, and the segment's chord counts
the part as any other, so its ``chorus.advance`` runs once the other calls
end and finds this one still out (it does nothing).

The answer (:func:`answer`) is one compare-and-set in Postgres, with its
audit event (``tool.approved`` / ``tool.denied``, carrying ``by``), committed
before anything is sent:

- approved: the call becomes ``approved`` (claimable), and a one-call
  segment is sent for it, ``chain(chorus.tool, chorus.advance)``: the tool
  runs, then the advance moves the cursor if no other call of the segment
  is still out, exactly as a chord part finishing last would;
- denied: the call is finished with an error result the model sees
  (``tool.failed``) and the segment's advance is sent if nothing else of it
  is out (:func:`~orchestrator.engine.after_commit.settle`).

If what is sent after the commit is lost (the process dies, Redis is down),
the sweeper finds the segment's ``approved`` call unfinished and sends it
again: an answer given while the broker does not answer is stored and
returns (:func:`sent_later_if_broker_down`), since repeating it would be a
``ConflictError``; a waiting call is never re-sent (only its answer moves it on). The
sweeper also denies calls whose wait passed their deadline
(:func:`expire`: "no answer in N s"). A stop (cancel, budget) records a
waiting or approved call ``cancelled`` like any unfinished call.

:func:`record` does the answer's writes on a session, so an asyncio caller
can run it in ``AsyncSession.run_sync`` and then publish and dispatch.
"""

from __future__ import annotations

import getpass
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis
from sqlmodel import Session

from orchestrator import registry
from orchestrator.engine.access import refusal
from orchestrator.engine.actions import Action, RunAdvance, RunSegment, ToolTask
from orchestrator.engine.after_commit import settle
from orchestrator.errors import (
    ApprovalNotFound,
    ConflictError,
    InvalidRequestError,
    UnknownToolError,
)
from orchestrator.events import Outbox
from orchestrator.runtime import Runtime
from orchestrator.store.approval_sql import (
    CallState,
    call_state,
    expired_calls,
    pending_calls,
    record_answer,
    start_waiting,
)
from orchestrator.store.tables import AWAITING_APPROVAL
from orchestrator.store.tool_call_sql import Claimed
from orchestrator.store.values import check
from schemas import AgentSpec, Decision, EventName, PendingApproval

log = logging.getLogger(__name__)

#: Who answers a call whose wait passed its deadline.
TIMEOUT_ANSWERER = "chorus"
#: Characters of a note, a reason or an answerer's name.
MAX_NOTE_CHARS = 2000
MAX_BY_CHARS = 200
#: Waiting calls listed at most, and denied at most by one sweep.
MAX_LISTED = 1000


class Gate(NamedTuple):
    """A call needs a person's answer; denied after ``timeout`` s (None: never)."""

    timeout: float | None


def gate(spec: AgentSpec, tool: str) -> Gate | None:
    """Does a call of ``tool`` by agent ``spec`` need approval? The tool's
    declaration (``approval=True``) or the agent's ``approve`` list says so;
    the timeout is the shorter of the tool's and the agent's that are set."""
    try:
        declared = registry.get_tool(tool).spec
    except UnknownToolError:
        declared = None
    if tool not in spec.approve and (declared is None or not declared.approval):
        return None
    timeouts = [
        t for t in (declared.approval_timeout if declared else None, spec.approval_timeout) if t
    ]
    return Gate(min(timeouts) if timeouts else None)


def hold(rt: Runtime, spec: AgentSpec, claimed: Claimed) -> bool:
    """Keep a claimed call that needs an answer from running: move it to
    ``awaiting`` (``tool.approval_requested``, with its arguments)
    and return True; the task then ends. False: run it (no approval needed,
    or already approved)."""
    call, turn, conv = claimed
    if call.answer is not None or refusal(spec, call.tool) is not None:
        return False  # approved: its run; or not the agent's: its error result
    found = gate(spec, call.tool)
    if found is None:
        return False
    with rt.transaction() as (session, outbox):
        if start_waiting(session, call.id, found.timeout):
            outbox.record_call(
                EventName.TOOL_APPROVAL_REQUESTED,
                conv,
                turn,
                call,
                call_id=call.id,
                params=call.params,
                timeout=found.timeout,
            )
            log.info("tool %s waits for approval (call %s)", call.tool, call.id)
    return True


def answer(
    rt: Runtime, call_id: str, decision: Decision, by: str | None, note: str | None
) -> list[Action]:
    """Record the one answer to a waiting call and return what to send
    after its commit. Raises :class:`ApprovalNotFound` for an unknown call
    and :class:`ConflictError` for one already answered or not waiting."""
    by, note = answerer(by), _text(note, "reason" if decision is Decision.DENIED else "note")
    if decision is Decision.DENIED and not note:
        raise InvalidRequestError("a denial needs a reason", ["reason"])
    with rt.transaction() as (session, outbox):
        actions = record(session, outbox, call_id, decision, by, note)
    return settle(rt, actions)


def broker_down(exc: BaseException) -> bool:
    """Is ``exc`` what sending to a broker that does not answer raises?
    (kombu wraps Redis's connection errors in its OperationalError once its
    retries are spent; kombu is looked for only if a send loaded it.)"""
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return True
    kombu_errors = sys.modules.get("kombu.exceptions")
    return kombu_errors is not None and isinstance(exc, kombu_errors.OperationalError)


@dataclass
class Delivery:
    """Whether a stored answer's actions reached the broker."""

    sent: bool = True


@contextmanager
def sent_later_if_broker_down(call_id: str) -> Iterator[Delivery]:
    """Around the send of a stored answer's actions: if the broker does not
    answer, log it and mark the delivery unsent. The answer is in Postgres
    and stands (a second one is a ``ConflictError``), so raising would tell
    the caller to repeat what cannot be repeated; the sweeper sends the
    approved call (a denied call's advance) once Redis is back."""
    delivery = Delivery()
    try:
        yield delivery
    except Exception as exc:
        if not broker_down(exc):
            raise
        delivery.sent = False
        log.warning(
            "the answer to call %s is stored; sending it failed (%s): "
            "the sweeper sends it once the broker answers",
            call_id,
            exc,
        )


def record(
    session: Session, outbox: Outbox, call_id: str, decision: Decision, by: str, note: str | None
) -> list[Action]:
    """The answer's writes in ``session``'s transaction and its events in
    ``outbox``; returns the actions to send once it commits."""
    state = call_state(session, call_id)
    if state is None:
        raise ApprovalNotFound(call_id)
    denied = decision is Decision.DENIED
    result = _denial(state.tool, note or "") if denied else None
    if not record_answer(session, call_id, decision, by, note, result):
        raise _conflict(call_state(session, call_id) or state)
    conv = _Conversation(state.conversation_id, state.root_id)
    turn = _Turn(state.turn_id, state.correlation_id)
    audit: dict[str, Any] = {"reason": note} if denied else {"note": note}
    outbox.record_call(
        EventName.TOOL_DENIED if denied else EventName.TOOL_APPROVED,
        conv,
        turn,
        state,
        call_id=state.id,
        by=by,
        **audit,
    )
    where = (state.conversation_id, state.turn_id, state.step, state.segment)
    if not denied:
        task = ToolTask(state.id, state.tool, state.queue)
        return [RunSegment(*where, (task,), state.priority)]
    outbox.record_call(
        EventName.TOOL_FAILED,
        conv,
        turn,
        state,
        result=result,
    )
    return [RunAdvance(*where, state.priority, if_ready=True)]


def pending(
    session: Session,
    conversation_id: str | None = None,
    agent: str | None = None,
    tool: str | None = None,
    limit: int = MAX_LISTED,
    tenant: str | None = None,
) -> list[PendingApproval]:
    """The calls waiting for an answer, oldest first (see
    :func:`~orchestrator.store.approval_sql.pending_calls`)."""
    return pending_calls(session, conversation_id, agent, tool, limit, tenant)


def expire(rt: Runtime, limit: int = MAX_LISTED) -> list[Action]:
    """The sweeper's part: deny every call whose wait passed its deadline,
    each in its own transaction ("no answer in N s"); a call answered
    meanwhile is left to its answer."""
    with rt.autocommit() as connection:
        ids = expired_calls(connection, limit)
    actions: list[Action] = []
    for call_id in ids:
        try:
            with rt.transaction() as (session, outbox):
                state = call_state(session, call_id)
                if state is None or state.status != AWAITING_APPROVAL:
                    continue
                waited = f"no answer in {_waited(state):g} s"
                denial = (Decision.DENIED, TIMEOUT_ANSWERER, waited)
                actions += record(session, outbox, call_id, *denial)
        except ConflictError:
            continue
    return settle(rt, actions) if actions else []


def answerer(by: str | None) -> str:
    """Who answers: ``by``, else this process's user."""
    if by is None:
        try:
            by = getpass.getuser()
        except (KeyError, OSError):
            by = "unknown"
    checked = _text(by, "by", MAX_BY_CHARS)
    if not checked:
        raise InvalidRequestError("by: must name who answers", ["by"])
    return checked


def _text(value: object, field: str, limit: int = MAX_NOTE_CHARS) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise InvalidRequestError(
            f"{field}: expected a string of at most {limit} characters, got {type(value).__name__}",
            [field],
        )
    check(value, field)  # no NUL, no lone surrogate: Postgres could not store it
    return value.strip()


def _waited(state: CallState) -> float:
    """Seconds a call may wait: its deadline less its start (both on the
    database's clock)."""
    if state.approval_deadline is None or state.approval_requested_at is None:
        return 0.0
    return round((state.approval_deadline - state.approval_requested_at).total_seconds(), 3)


def _denial(tool: str, reason: str) -> str:
    """The error result the model sees for a denied call."""
    return f"Error: tool {tool!r} was not run: denied: {reason}"


def _conflict(state: CallState) -> ConflictError:
    if state.answer is not None:
        return ConflictError(
            f"tool call {state.id!r} was already {state.answer} by {state.answered_by!r}"
        )
    if state.status == AWAITING_APPROVAL:
        return ConflictError(f"tool call {state.id!r}: its job is being stopped")
    return ConflictError(f"tool call {state.id!r} is not waiting for approval ({state.status})")


class _Conversation(NamedTuple):
    id: str
    root_id: str


class _Turn(NamedTuple):
    id: str
    correlation_id: str
