"""Human approvals of tool calls, as data: a call waiting for an answer."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from schemas.content import Frozen


class Decision(StrEnum):
    """A person's answer to a call waiting for approval."""

    APPROVED = "approved"
    DENIED = "denied"


class PendingApproval(Frozen):
    """A tool call waiting for a person's answer (``tool.approval_requested``).

    ``call_id`` is what ``approve`` and ``deny`` take; ``job_id`` the job
    whose tree made the call (a subagent's call names its top-level job),
    ``conversation_id`` the conversation that made it and ``root_id`` its
    tree's root. ``deadline`` is when it is denied unanswered (None: never).
    """

    call_id: str
    job_id: str
    conversation_id: str
    root_id: str
    agent: str
    tool: str
    arguments: dict[str, Any]
    requested_at: datetime
    deadline: datetime | None = None
