"""Planning: the ``manage_todo_list`` tool and the plan it keeps.

An agent with ``planning`` is offered ``manage_todo_list``, which takes the
whole todo list each time (``[{id, title, status}]``, at most one item
``in-progress``). A valid call replaces the conversation's plan and records
``plan.updated``; an invalid one is answered with an error result saying
why, and the plan stays as it was. The call is answered by the step that
stores it, in the same transaction (it touches only Chorus's own rows), so
it runs exactly once with that step.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import TypeAdapter, ValidationError
from sqlmodel import Session

from orchestrator.errors import InvalidRequestError, invalid
from orchestrator.events import Outbox
from orchestrator.store.history_sql import store_plan
from orchestrator.store.tables import Conversation, ToolCallRow, Turn
from orchestrator.store.values import check
from schemas import AgentSpec, EventName, TodoItem, ToolSpec
from schemas.plans import MAX_PLAN_ITEMS

PLAN_TOOL = "manage_todo_list"

_ITEMS = TypeAdapter(list[TodoItem])

_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "todos": {
            "type": "array",
            "maxItems": MAX_PLAN_ITEMS,
            "description": "The complete todo list: every item, each time, in order.",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "description": "Unique number."},
                    "title": {"type": "string", "description": "What to do, briefly."},
                    "status": {
                        "type": "string",
                        "enum": ["not-started", "in-progress", "completed"],
                        "description": "At most one item may be in-progress.",
                    },
                },
                "required": ["id", "title", "status"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["todos"],
    "additionalProperties": False,
}


def plan_tool(spec: AgentSpec) -> ToolSpec | None:
    """The planning tool, offered to an agent with ``planning``."""
    if not spec.planning:
        return None
    return ToolSpec(
        name=PLAN_TOOL,
        description="Write the plan of your work as a todo list, and keep it current: "
        "send the whole list each time, mark an item in-progress before you start it "
        "(one at a time) and completed as soon as it is done.",
        parameters=_PARAMETERS,
        queue="control",
    )


def read_plan(params: dict[str, Any]) -> list[TodoItem]:
    """The plan a call writes; :class:`InvalidRequestError` saying what is wrong."""
    extra = sorted(set(params) - {"todos"})
    if extra:
        raise InvalidRequestError(f"unexpected arguments: {extra}; give only todos", extra)
    todos = params.get("todos")
    if not isinstance(todos, list):
        raise InvalidRequestError("todos: a list of {id, title, status} items is required")
    if len(todos) > MAX_PLAN_ITEMS:
        raise InvalidRequestError(f"todos: {len(todos)} items; at most {MAX_PLAN_ITEMS}")
    try:
        plan = _ITEMS.validate_python(todos)
    except ValidationError as exc:
        raise invalid(exc, "todos") from None
    check([i.title for i in plan], "todos")
    twice = sorted(i for i, n in Counter(i.id for i in plan).items() if n > 1)
    if twice:
        raise InvalidRequestError(f"todos: ids must be unique; {twice} appear more than once")
    running = [i.id for i in plan if i.status == "in-progress"]
    if len(running) > 1:
        raise InvalidRequestError(
            f"todos: at most one item may be in-progress; items {running} are. "
            "Finish one (completed) or set the others back to not-started."
        )
    return plan


def update_plan(
    session: Session, outbox: Outbox, conv: Conversation, turn: Turn, call: ToolCallRow
) -> tuple[str, bool]:
    """Answer a ``manage_todo_list`` call: store the plan and record
    ``plan.updated``, or (a plan refused) leave it. Returns the call's
    result and whether it is an error."""
    try:
        plan = read_plan(call.params)
    except InvalidRequestError as exc:
        return f"Error: the plan was not updated: {exc}", True
    stored = [item.model_dump() for item in plan]
    store_plan(session, conv.id, stored)
    outbox.record(
        EventName.PLAN_UPDATED,
        conv,
        turn,
        call.step,
        tool_request_id=call.tool_request_id,
        plan=stored,
    )
    return _summary(plan), False


def _summary(plan: list[TodoItem]) -> str:
    counts = Counter(item.status for item in plan)
    current = next((i for i in plan if i.status == "in-progress"), None)
    doing = f"; in progress: {current.id}. {current.title}" if current else ""
    return (
        f"Plan updated: {len(plan)} items ({counts['completed']} completed, "
        f"{counts['in-progress']} in progress, {counts['not-started']} not started){doing}"
    )
