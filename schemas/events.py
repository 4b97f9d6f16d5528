"""The event envelope and the one vocabulary of event names (docs/architecture.md)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import Field

from schemas.content import Frozen


class EventName(StrEnum):
    TURN_STARTED = "turn.started"
    TURN_COMPLETED = "turn.completed"
    TURN_FAILED = "turn.failed"
    TURN_CANCELLED = "turn.cancelled"
    LLM_REQUESTED = "llm.requested"
    LLM_COMPLETED = "llm.completed"
    LLM_FAILED = "llm.failed"
    ASSISTANT_DELTA = "assistant.delta"
    ASSISTANT_MESSAGE = "assistant.message"
    TOOL_REQUESTED = "tool.requested"
    TOOL_STARTED = "tool.started"
    TOOL_COMPLETED = "tool.completed"
    TOOL_FAILED = "tool.failed"
    TOOL_CANCELLED = "tool.cancelled"
    TOOL_APPROVAL_REQUESTED = "tool.approval_requested"
    TOOL_APPROVED = "tool.approved"
    TOOL_DENIED = "tool.denied"
    SUBAGENT_REQUESTED = "subagent.requested"
    SUBAGENT_STARTED = "subagent.started"
    SUBAGENT_COMPLETED = "subagent.completed"
    SUBAGENT_FAILED = "subagent.failed"
    SUBAGENT_STOPPED = "subagent.stopped"
    AGENT_HANDOFF = "agent.handoff"
    PLAN_UPDATED = "plan.updated"
    MESSAGE_QUEUED = "message.queued"
    MESSAGE_DEQUEUED = "message.dequeued"
    QUEUE_CLEARED = "queue.cleared"
    QUEUE_UNREAD = "queue.unread"
    CHECKPOINT_STARTED = "checkpoint.started"
    CHECKPOINT_COMPLETED = "checkpoint.completed"
    USAGE = "usage"
    BUDGET_EXCEEDED = "budget.exceeded"

    @property
    def live_only(self) -> bool:
        """Deltas are streamed, never stored."""
        return self is EventName.ASSISTANT_DELTA


TERMINAL_TURN_EVENTS = frozenset(
    {EventName.TURN_COMPLETED, EventName.TURN_FAILED, EventName.TURN_CANCELLED}
)


class Event(Frozen):
    """One event. ``seq`` orders events per root; live-only events have none."""

    name: EventName
    conversation_id: str
    root_id: str
    turn_id: str | None = None
    step: int | None = None
    correlation_id: str | None = None
    time: datetime
    seq: int | None = None
    data: dict[str, Any] = Field(default_factory=dict)
