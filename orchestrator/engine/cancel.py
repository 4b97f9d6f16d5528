"""Cancelling a job: its turn and every descendant's, in one sweep.

A job's subagent turns share its correlation id, so the tree is "every
running turn with this correlation id". Each is ended ``cancelled``, its
unfinished tool calls are recorded ``cancelled`` (``tool.cancelled``, or
``subagent.stopped`` for a subagent call), and the conversations go idle.
A flag in Redis stops in-flight model calls at their next streamed chunk;
the caller revokes the returned tool tasks still queued or running.
"""

from __future__ import annotations

from sqlalchemy import update
from sqlmodel import Session, col, select

from orchestrator.engine.actions import Action
from orchestrator.engine.cursor import finish_turn
from orchestrator.engine.subagents import is_subagent_call
from orchestrator.errors import InvalidRequestError
from orchestrator.events import Outbox
from orchestrator.keys import cancelled
from orchestrator.runtime import Runtime
from orchestrator.store.tables import CALL_FINISHED, Conversation, ToolCallRow, Turn, utcnow
from schemas import EventName, TurnStatus

#: How often a cancel retries turns whose cursor moved under it.
ATTEMPTS = 20


def _cancel_calls(session: Session, outbox: Outbox, conv: Conversation, turn: Turn) -> list[str]:
    calls = session.exec(
        select(ToolCallRow).where(
            ToolCallRow.turn_id == turn.id, col(ToolCallRow.status).not_in(CALL_FINISHED)
        )
    ).all()
    for call in calls:
        session.execute(
            update(ToolCallRow)
            .where(col(ToolCallRow.id) == call.id)
            .values(status="cancelled", result="cancelled", is_error=True, finished_at=utcnow())
        )
        subagent = is_subagent_call(call.tool)
        outbox.record(
            EventName.SUBAGENT_STOPPED if subagent else EventName.TOOL_CANCELLED,
            conv,
            turn,
            call.step,
            tool=call.tool,
            tool_request_id=call.tool_request_id,
        )
    return [c.id for c in calls]


def cancel(rt: Runtime, job_id: str) -> tuple[list[str], list[Action]]:
    """Cancel the job's tree. Returns the tool call ids (= task ids) to
    revoke and what to dispatch next (the root conversation's dequeue).
    Idempotent: a finished job has nothing left to cancel."""
    return stop_tree(rt, job_id, TurnStatus.CANCELLED, "cancelled")


def stop_tree(
    rt: Runtime, job_id: str, status: TurnStatus, reason: str
) -> tuple[list[str], list[Action]]:
    """End every running turn of the job's tree with ``status`` and ``reason``."""
    with rt.session() as session:
        root = session.get(Turn, job_id)
        if root is None:
            raise InvalidRequestError(f"no job {job_id!r}", ["job_id"])
        correlation_id = root.correlation_id
    rt.redis.set(cancelled(rt.settings.redis_prefix, correlation_id), job_id, ex=24 * 3600)
    revoke: list[str] = []
    actions: list[Action] = []
    for _ in range(ATTEMPTS):
        with rt.transaction() as (session, outbox):
            running = session.exec(
                select(Turn).where(
                    Turn.correlation_id == correlation_id,
                    Turn.status == TurnStatus.RUNNING.value,
                )
            ).all()
            if not running:
                return revoke, actions
            round_revoke: list[str] = []
            round_actions: list[Action] = []
            # Deepest first, the job's own turn last; per turn its calls first,
            # so the job's turn.cancelled is the tree's last event.
            for turn in sorted(running, key=lambda t: (t.id == job_id, -t.started_at.timestamp())):
                conv = session.get(Conversation, turn.conversation_id)
                assert conv is not None
                calls = _cancel_calls(session, outbox, conv, turn)
                ended = finish_turn(
                    session,
                    outbox,
                    conv,
                    turn,
                    status,
                    error=reason,
                    notify_parent=False,
                )
                if ended is None:  # a cursor moved meanwhile: undo this round, go again
                    outbox.discard()
                    session.rollback()
                    break
                round_revoke += calls
                round_actions += ended
            else:
                revoke += round_revoke
                actions += round_actions
    raise RuntimeError(f"job {job_id}: turns kept moving while being stopped")
