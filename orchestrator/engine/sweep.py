"""The sweeper: re-dispatch the cursor of any turn that stopped moving.

A lost message, a dead worker or a broken chord then costs a delay, never
a conversation. Re-dispatching is safe because every task is idempotent.
It also finishes stops: a job marked stopping whose turn still runs (the
stopping process died midway), and a job past its wall-time budget whose
``chorus.deadline`` task was lost.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import or_, update
from sqlmodel import Session, col, select

from orchestrator import registry
from orchestrator.engine.actions import Action, Revoke, RunSegment, RunStep, ToolTask
from orchestrator.engine.budget import wall_time_left
from orchestrator.engine.cancel import deadline, resume_stop
from orchestrator.engine.subagents import is_subagent_call
from orchestrator.errors import ChorusError, UnknownToolError
from orchestrator.runtime import Runtime
from orchestrator.store.tables import CALL_FINISHED, Conversation, ToolCallRow, Turn, utcnow
from schemas import ConversationState, TurnStatus

log = logging.getLogger(__name__)


def _tool_timeout(name: str) -> float:
    try:
        return registry.get_tool(name).spec.timeout
    except UnknownToolError:
        return 0.0


def _segment_action(session: Session, conv: Conversation, stall: float) -> Action | None:
    assert conv.turn_id is not None
    calls = session.exec(
        select(ToolCallRow).where(
            ToolCallRow.turn_id == conv.turn_id,
            ToolCallRow.step == conv.cursor_step,
            ToolCallRow.segment == conv.cursor_segment,
        )
    ).all()
    now = utcnow()
    for c in calls:
        if c.status != "running":
            continue
        if is_subagent_call(c.tool):
            return None  # its child answers it; the child is swept on its own
        if c.started_at and c.started_at + timedelta(seconds=_tool_timeout(c.tool) + stall) > now:
            return None  # still inside its own timeout
    tasks = tuple(ToolTask(c.id, c.tool, c.queue) for c in calls if c.status not in CALL_FINISHED)
    return RunSegment(conv.id, conv.turn_id, conv.cursor_step, conv.cursor_segment, tasks)


def sweep(rt: Runtime, limit: int = 500) -> list[Action]:
    """Find running conversations with no progress for ``stall_timeout``
    and return their current step or segment to dispatch again."""
    stall = rt.settings.stall_timeout
    now = utcnow()
    actions: list[Action] = []
    with rt.session() as session:
        stalled = session.exec(
            select(Conversation)
            .where(
                Conversation.state == ConversationState.RUNNING.value,
                col(Conversation.progress_at) < now - timedelta(seconds=stall),
                or_(  # a deferred step (retry, rate limit) is not stalled before it is due
                    col(Conversation.due_at).is_(None),
                    col(Conversation.due_at) < now - timedelta(seconds=stall),
                ),
            )
            .limit(limit)
        ).all()
        for conv in stalled:
            if conv.turn_id is None:
                continue
            action: Action | None
            if conv.cursor_segment < 0:
                live_lease = conv.lease_until is not None and conv.lease_until > now
                action = None if live_lease else RunStep(conv.id, conv.turn_id, conv.cursor_step)
            else:
                action = _segment_action(session, conv, stall)
            if action is None:
                continue
            session.execute(  # restart the stall clock; the version is untouched
                update(Conversation).where(col(Conversation.id) == conv.id).values(progress_at=now)
            )
            actions.append(action)
    return actions + _finish_stops(rt, limit)


def _finish_stops(rt: Runtime, limit: int) -> list[Action]:
    """Stop what should be stopping: marked jobs still running, and jobs
    whose wall-time budget is spent."""
    with rt.session() as session:
        jobs = session.exec(
            select(Turn)
            .where(
                Turn.status == TurnStatus.RUNNING.value,
                col(Turn.job_id) == col(Turn.id),
                or_(
                    col(Turn.stop_status).is_not(None),
                    col(Turn.budget)["wall_seconds"].as_float().is_not(None),
                ),
            )
            .limit(limit)
        ).all()
    actions: list[Action] = []
    for job in jobs:
        try:
            if job.stop_status is not None:
                revoke, ended = resume_stop(rt, job.id)
                actions += [*ended, Revoke(tuple(revoke))]
            elif (left := wall_time_left(job)) is not None and left <= 0:
                actions += deadline(rt, job.id)
        except ChorusError:
            log.warning("could not stop job %s; the next sweep tries again", job.id, exc_info=True)
    return actions
