"""Pure data contracts of Chorus: no I/O, no Celery, no SQL."""

from schemas.approvals import Decision, PendingApproval
from schemas.content import (
    ContentBlock,
    Message,
    RawBlock,
    Role,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultBlock,
    Usage,
    content_blocks_adapter,
)
from schemas.events import TERMINAL_TURN_EVENTS, Event, EventName
from schemas.jobs import ConversationState, JobRequest, JobStatus, MessageOptions, TurnStatus
from schemas.plans import TodoItem
from schemas.specs import AgentSpec, Budget, RateLimit, RetryPolicy, ToolSpec

__all__ = [
    "TERMINAL_TURN_EVENTS",
    "AgentSpec",
    "Budget",
    "ContentBlock",
    "ConversationState",
    "Decision",
    "Event",
    "EventName",
    "JobRequest",
    "JobStatus",
    "Message",
    "MessageOptions",
    "PendingApproval",
    "RateLimit",
    "RawBlock",
    "RetryPolicy",
    "Role",
    "TextBlock",
    "ThinkingBlock",
    "TodoItem",
    "ToolCallBlock",
    "ToolResultBlock",
    "ToolSpec",
    "TurnStatus",
    "Usage",
    "content_blocks_adapter",
]
