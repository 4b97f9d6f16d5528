"""The sweeper: re-dispatch the cursor of any turn that stopped moving.

A lost message, a dead worker or a broken chord then costs a delay, never
a conversation. Re-dispatching is safe because every task is idempotent.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import or_, update
from sqlmodel import Session, col, select

from orchestrator import registry
from orchestrator.engine.actions import Action, RunSegment, RunStep, ToolTask
from orchestrator.engine.subagents import is_subagent_call
from orchestrator.errors import UnknownToolError
from orchestrator.runtime import Runtime
from orchestrator.store.tables import CALL_FINISHED, Conversation, ToolCallRow, utcnow
from schemas import ConversationState


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
    return actions
