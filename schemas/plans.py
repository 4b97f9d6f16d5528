"""A conversation's plan: the todo list its agent keeps with ``manage_todo_list``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.content import Frozen

#: Items one plan may hold.
MAX_PLAN_ITEMS = 100

TodoStatus = Literal["not-started", "in-progress", "completed"]


class TodoItem(Frozen):
    """One item of a plan; at most one item of a plan is ``in-progress``."""

    id: int = Field(ge=1, description="A number naming the item, unique in the plan")
    title: str = Field(min_length=1, max_length=500, description="What to do, briefly")
    status: TodoStatus = Field(description="not-started, in-progress or completed")
