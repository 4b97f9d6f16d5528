"""Job request, status and result: what the client sends and reads back."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field

from schemas.content import Frozen, Usage
from schemas.specs import AgentSpec, Budget

#: Largest accepted ``context_data``, in bytes of JSON.
MAX_CONTEXT_BYTES = 256_000

#: A job's priority: 0 (lowest) to 9 (highest); a higher one is taken from
#: the queues first. Every task of the job's tree carries it.
MIN_PRIORITY, MAX_PRIORITY = 0, 9
DEFAULT_PRIORITY = 5


class TurnStatus(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self is not TurnStatus.RUNNING


class ConversationState(StrEnum):
    IDLE = "idle"
    RUNNING = "running"


class JobRequest(Frozen):
    """One turn to run: an agent (registered name or inline spec) and input."""

    agent: str | AgentSpec
    #: Capped by the ``CHORUS_MAX_INPUT_CHARS`` setting, checked at submit.
    input: str = Field(min_length=1)
    conversation_id: str | None = Field(default=None, max_length=64)
    context_data: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)
    budget: Budget | None = None
    priority: int = Field(default=DEFAULT_PRIORITY, ge=MIN_PRIORITY, le=MAX_PRIORITY, strict=True)
    #: The HTTP API tenant the new conversation belongs to (``chorus
    #: server`` sets its token's); only a job that starts a conversation.
    tenant: str | None = Field(default=None, min_length=1, max_length=64)


class MessageOptions(Frozen):
    """What a sent message's turn runs with, where it differs from the
    conversation's last job: each field left None is inherited from that
    job (its ``context_data``, its budget, its priority)."""

    context_data: dict[str, Any] | None = None
    budget: Budget | None = None
    priority: int | None = Field(default=None, ge=MIN_PRIORITY, le=MAX_PRIORITY, strict=True)


class JobStatus(Frozen):
    """Where a job stands."""

    job_id: str
    conversation_id: str
    root_id: str
    #: The agent holding the turn: the job's agent, or the target of its last handoff.
    agent: str
    status: TurnStatus
    step: int
    output: str | None = None
    structured: Any = None
    error: str | None = None
    usage: Usage = Usage()
    tree_usage: Usage = Usage()
