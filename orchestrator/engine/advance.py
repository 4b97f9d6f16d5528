"""``chorus.advance``: after a segment, move the cursor once (compare-and-set)."""

from __future__ import annotations

from sqlalchemy import func, null, update
from sqlmodel import col, select

from orchestrator.engine.actions import Action, RunSegment, RunStep, ToolTask
from orchestrator.engine.cancel import stopping
from orchestrator.engine.cursor import is_current, move_cursor
from orchestrator.runtime import Runtime
from orchestrator.store.tables import CALL_FINISHED, Conversation, MessageRow, ToolCallRow, Turn
from schemas import ToolResultBlock


def advance(
    rt: Runtime, conversation_id: str, turn_id: str, step: int, segment: int
) -> list[Action]:
    """If every call of ``segment`` has its result, dispatch the next
    segment, or store the step's tool results and call the model again.

    Two copies racing here both read the same version; the update
    ``WHERE version = :v`` lets exactly one through.
    """
    with rt.session() as session:
        conv = session.get(Conversation, conversation_id)
        if conv is None or not is_current(conv, turn_id, step, segment):
            return []
        turn = session.get(Turn, turn_id)
        if turn is None or stopping(session, turn):
            return []  # the job is being stopped: nothing more runs
        # Count before loading: with N subagents, N-1 of their advances find
        # work still out, and should not each read all N calls.
        pending = session.exec(
            select(func.count())
            .select_from(ToolCallRow)
            .where(
                ToolCallRow.turn_id == turn_id,
                ToolCallRow.step == step,
                ToolCallRow.segment == segment,
                col(ToolCallRow.status).not_in(CALL_FINISHED),
            )
        ).one()
        if pending:
            return []  # a part is still out; its own advance (or the sweeper) comes later
        calls = session.exec(
            select(ToolCallRow)
            .where(ToolCallRow.turn_id == turn_id, ToolCallRow.step == step)
            .order_by(col(ToolCallRow.position))
        ).all()
        last = max(c.segment for c in calls)
        if segment < last:
            if not move_cursor(session, conv, cursor_segment=segment + 1):
                return []
            nxt = tuple(ToolTask(c.id, c.tool, c.queue) for c in calls if c.segment == segment + 1)
            return [RunSegment(conversation_id, turn_id, step, segment + 1, nxt)]
        if not move_cursor(session, conv, cursor_step=step + 1, cursor_segment=-1):
            return []
        blocks = [
            ToolResultBlock(
                tool_request_id=c.tool_request_id, tool=c.tool, result=c.result, is_error=c.is_error
            ).model_dump(mode="json")
            for c in calls
        ]
        session.add(
            MessageRow(
                conversation_id=conversation_id,
                turn_id=turn_id,
                step=step,
                kind="tool_results",
                role="user",
                content=blocks,
            )
        )
        # The message is now the results' one copy (docs/architecture.md, Storage).
        session.execute(
            update(ToolCallRow)
            .where(col(ToolCallRow.turn_id) == turn_id, col(ToolCallRow.step) == step)
            .values(result=null())
        )
    return [RunStep(conversation_id, turn_id, step + 1)]
