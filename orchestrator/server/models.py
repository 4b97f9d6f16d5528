"""Request and response bodies of the HTTP API (Pydantic; the OpenAPI
document is generated from them)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas import Budget, TurnStatus, Usage
from schemas.jobs import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY

#: Longest idempotency key over HTTP: the server prefixes it with the
#: tenant (``tenant:<tenant>:<key>``, a key is the tenant's own) and the
#: whole must fit 200 characters.
MAX_IDEMPOTENCY_KEY = 128
#: An agent's registered name (``Agent("name", ...)``).
AGENT_NAME = Field(min_length=1, max_length=64)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SubmitRequest(_Body):
    """A job: a registered agent's name (inline specs are refused over HTTP)
    and its input. ``context_data.tenant`` is always the token's tenant."""

    agent: str = AGENT_NAME
    input: str = Field(min_length=1)
    conversation_id: str | None = Field(default=None, min_length=1, max_length=64)
    context_data: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=MAX_IDEMPOTENCY_KEY)
    budget: Budget | None = None
    priority: int = Field(default=DEFAULT_PRIORITY, ge=MIN_PRIORITY, le=MAX_PRIORITY)


class JobCreated(BaseModel):
    job_id: str
    conversation_id: str
    root_id: str


class JobUsage(BaseModel):
    """The turn's own usage, and its whole tree's (subagents included)."""

    usage: Usage
    tree_usage: Usage


class JobResult(BaseModel):
    """A finished, completed job's answer (and structured output, when its
    agent has an ``output`` model)."""

    job_id: str
    status: TurnStatus
    output: str
    structured: Any = None


class JobSummary(BaseModel):
    job_id: str
    conversation_id: str
    agent: str
    status: TurnStatus
    tenant: str | None = None
    started_at: datetime
    finished_at: datetime | None = None


class JobPage(BaseModel):
    """One page of jobs, newest first; ``next_cursor`` fetches the next (None: no more)."""

    jobs: list[JobSummary]
    next_cursor: str | None = None


class SendRequest(_Body):
    """A message for a conversation: runs now if it is idle, else queued.
    Each option left out is the conversation's last job's."""

    text: str = Field(min_length=1)
    context_data: dict[str, Any] | None = None
    budget: Budget | None = None
    priority: int | None = Field(default=None, ge=MIN_PRIORITY, le=MAX_PRIORITY)


class MessageSent(BaseModel):
    """The message's queue entry, and the job it started (None: queued)."""

    entry_id: str
    job_id: str | None = None


class QueueCleared(BaseModel):
    cleared: int


class Forked(BaseModel):
    conversation_id: str


class Ready(BaseModel):
    postgres: bool
    redis: bool


class ApprovalRequest(_Body):
    """A person's answer to a tool call waiting for one: ``approve`` (with
    an optional ``note``) runs it; ``deny`` (with a ``reason``, required)
    gives the model an error result with the reason instead."""

    decision: Literal["approve", "deny"]
    note: str | None = Field(default=None, max_length=2000)
    reason: str | None = Field(default=None, max_length=2000)


class ApprovalAnswered(BaseModel):
    """The answer recorded (``by``: the token's name)."""

    call_id: str
    decision: Literal["approved", "denied"]
    by: str
