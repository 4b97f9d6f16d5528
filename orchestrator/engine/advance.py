"""``chorus.advance``: after a segment, move the cursor once (compare-and-set)."""

from __future__ import annotations

from sqlalchemy import bindparam, exists, null, update
from sqlalchemy.orm import aliased
from sqlmodel import col, select

from orchestrator.engine.actions import Action, RunSegment, RunStep, ToolTask
from orchestrator.engine.cursor import move_cursor_from
from orchestrator.engine.handoffs import handoff_in, take_over, target_values
from orchestrator.engine.outputs import view
from orchestrator.engine.prebuilt import run, table
from orchestrator.runtime import Runtime
from orchestrator.store.tables import CALL_FINISHED, Conversation, MessageRow, ToolCallRow
from schemas import ConversationState, ToolResultBlock


def advance(
    rt: Runtime, conversation_id: str, turn_id: str, step: int, segment: int
) -> list[Action]:
    """If every call of ``segment`` has its result, dispatch the next
    segment, or store the step's tool results and call the model again.

    One read (the step's calls, none while a call of the segment is still
    out) and one compare-and-set of the cursor on its position, which also
    refuses once the job is being stopped: of two racing copies exactly one
    moves it. The tool results message commits with the move, and so does
    the step's handoff, if it made one (the next step runs the target).
    """
    with rt.transaction() as (session, outbox):
        rows = session.exec(
            _READY,
            params={
                "conversation_id": conversation_id,
                "turn_id": turn_id,
                "step": step,
                "segment": segment,
            },
        ).all()
        if not rows:
            return []
        calls = [call for call, _ in rows]
        priority = rows[0][1]
        position = (turn_id, step, segment)
        last = max(c.segment for c in calls)
        if segment < last:
            if not move_cursor_from(session, conversation_id, position, cursor_segment=segment + 1):
                return []
            nxt = tuple(ToolTask(c.id, c.tool, c.queue) for c in calls if c.segment == segment + 1)
            return [RunSegment(conversation_id, turn_id, step, segment + 1, nxt, priority)]
        handoff = handoff_in(calls)
        if not move_cursor_from(
            session,
            conversation_id,
            position,
            cursor_step=step + 1,
            cursor_segment=-1,
            **(target_values(handoff) if handoff else {}),
        ):
            return []
        if handoff:
            take_over(session, outbox, handoff)
        blocks = [
            ToolResultBlock(
                tool_request_id=c.tool_request_id,
                tool=c.tool,
                result=c.result
                if c.view_chars is None
                else view(c.id, c.tool, c.result, c.view_chars),
                is_error=c.is_error,
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
        run(session, _CLEAR_RESULTS, {"where_turn_id": turn_id, "where_step": step})
    return [RunStep(conversation_id, turn_id, step + 1, priority)]


_pending = aliased(ToolCallRow)

#: The step's calls, each with the priority the next tasks are sent with;
#: none while a call of the segment is still out (its own advance, or the
#: sweeper, comes later) or once the cursor has moved on: with N subagents,
#: N-1 of their advances find work out, and the late ones a moved cursor,
#: and read no call. Built once: it runs for every call's end.
_READY = (
    select(ToolCallRow, Conversation.priority)
    .join(Conversation, col(Conversation.id) == col(ToolCallRow.conversation_id))
    .where(
        col(ToolCallRow.turn_id) == bindparam("turn_id"),
        col(ToolCallRow.step) == bindparam("step"),
        col(Conversation.id) == bindparam("conversation_id"),
        col(Conversation.state) == ConversationState.RUNNING.value,
        col(Conversation.turn_id) == bindparam("turn_id"),
        col(Conversation.cursor_step) == bindparam("step"),
        col(Conversation.cursor_segment) == bindparam("segment"),
        ~exists().where(
            col(_pending.turn_id) == bindparam("turn_id"),
            col(_pending.step) == bindparam("step"),
            col(_pending.segment) == bindparam("segment"),
            col(_pending.status).not_in(CALL_FINISHED),
        ),
    )
    .order_by(col(ToolCallRow.position))
)

_CALLS = table(ToolCallRow)

#: The tool results message is now the results' one copy (docs/architecture.md,
#: Storage), but for an archived result: its row keeps it whole.
_CLEAR_RESULTS = (
    update(_CALLS)
    .where(
        _CALLS.c.turn_id == bindparam("where_turn_id"),
        _CALLS.c.step == bindparam("where_step"),
        _CALLS.c.view_chars.is_(None),
    )
    .values(result=null())
)
