"""``chorus.advance``: after a segment, move the cursor once (compare-and-set)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row

from orchestrator.engine.actions import Action, RunSegment, RunStep, ToolTask
from orchestrator.engine.handoffs import handoff_in, take_over, target_values
from orchestrator.engine.subagent_answers import has_answers, observe_answers
from orchestrator.engine.tool_outputs import view
from orchestrator.runtime import Runtime
from orchestrator.store.advance_sql import clear_results, finish_step, ready_calls
from orchestrator.store.cursor_sql import move_from_position
from orchestrator.store.db import Db
from orchestrator.store.statements import insert_new
from orchestrator.store.tables import MessageRow
from schemas import ToolResultBlock


def advance(
    rt: Runtime, conversation_id: str, turn_id: str, step: int, segment: int
) -> list[Action]:
    """If every call of ``segment`` has its result, dispatch the next
    segment, or store the step's tool results and call the model again.

    One read (the step's calls, none while a call of the segment is still
    out) and one compare-and-set of the cursor on its position, which also
    refuses once the job is being stopped: of two racing copies exactly one
    moves it. The tool results message commits with the move, and so does
    the step's handoff, if it made one (the next step runs the target). The
    read takes no lock, so it runs on its own; the usual end of a step (its
    last segment, no handoff) is then :func:`finish_step`, where it can be
    one statement (Postgres): the move, the results message and the
    clearing of the call rows' results. Subagents' answers in the segment
    first go through the parent's ``after_tool`` hooks
    (:func:`~orchestrator.engine.subagent_answers.observe_answers`), between the
    read and the write.
    """
    ids = (conversation_id, turn_id, step)
    with rt.guarded_write() as db:
        calls = ready_calls(db, ids, segment)
        if not calls:
            return []
        last = max(c.segment for c in calls)
        handoff = handoff_in(calls)
        answers = has_answers(calls, segment)
        if segment == last and handoff is None and not answers:
            return _finish(db, ids, segment, calls)
    if answers:  # user code: outside any transaction (engine/subagent_answers.py)
        observe_answers(rt, calls, segment)
        if segment == last and handoff is None:
            with rt.guarded_write() as db:
                return _finish(db, ids, segment, calls)
    priority = calls[0].priority
    position = (turn_id, step, segment)
    with rt.transaction() as (session, outbox):
        if segment < last:
            if not move_from_position(
                session, conversation_id, position, cursor_segment=segment + 1
            ):
                return []
            nxt = tuple(ToolTask(c.id, c.tool, c.queue) for c in calls if c.segment == segment + 1)
            return [RunSegment(conversation_id, turn_id, step, segment + 1, nxt, priority)]
        if not move_from_position(
            session,
            conversation_id,
            position,
            cursor_step=step + 1,
            cursor_segment=-1,
            **(target_values(handoff) if handoff else {}),
        ):
            return []
        if handoff:
            take_over(session, outbox, (conversation_id, turn_id, step), handoff)
        insert_new(session, (MessageRow, _results_message((conversation_id, turn_id, step), calls)))
        clear_results(session, turn_id, step)
    return [RunStep(conversation_id, turn_id, step + 1, priority)]


def _finish(
    db: Db, ids: tuple[str, str, int], segment: int, calls: Sequence[Row[Any]]
) -> list[Action]:
    """The usual end of a step (:func:`finish_step`) and its next step."""
    conversation_id, turn_id, step = ids
    moved = finish_step(db, ids, segment, _results_message(ids, calls))
    return [RunStep(conversation_id, turn_id, step + 1, calls[0].priority)] if moved else []


def _results_message(ids: tuple[str, str, int], calls: Sequence[Row[Any]]) -> dict[str, Any]:
    """The values of the step's tool results message (archived results as views)."""
    conversation_id, turn_id, step = ids
    blocks = [
        ToolResultBlock(
            tool_request_id=c.tool_request_id,
            tool=c.tool,
            result=c.result if c.view_chars is None else view(c.id, c.tool, c.result, c.view_chars),
            is_error=c.is_error,
        ).model_dump(mode="json")
        for c in calls
    ]
    return {
        "conversation_id": conversation_id,
        "turn_id": turn_id,
        "step": step,
        "kind": "tool_results",
        "role": "user",
        "content": blocks,
    }
