"""What both clients check of their arguments, and the requests they build.

:class:`~orchestrator.client.Client` and
:class:`~orchestrator.async_client.AsyncClient` take the same arguments and
refuse the same ones: pure functions, no I/O.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import ValidationError

from orchestrator.errors import InvalidRequestError, invalid
from orchestrator.store.values import check
from schemas import AgentSpec, Budget, JobRequest, MessageOptions

#: Longest id a caller may name: a job, a conversation (as ``submit``
#: takes it), a queued message's entry, an archived output's handle.
MAX_ID_CHARS = 64
#: Largest event sequence number (Postgres ``bigint``).
MAX_SEQ = 2**63 - 1


def refuse(field: str, expected: str, value: object) -> InvalidRequestError:
    """The error for ``value`` given as ``field`` where ``expected`` was."""
    got = f"{len(value)} characters" if isinstance(value, str) else type(value).__name__
    return InvalidRequestError(f"{field}: expected {expected}, got {got}", [field])


def valid_id(value: object, field: str) -> str:
    """``value`` if it could be an id: a storable string of 1 to
    :data:`MAX_ID_CHARS` characters; else :class:`InvalidRequestError`
    naming ``field`` (the same checks as ``submit``)."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_CHARS:
        raise refuse(field, f"a string of 1 to {MAX_ID_CHARS} characters", value)
    check(value, field)
    return value


def conversation(conversation_id: object) -> str:
    """The id, if it could name a conversation (else :class:`InvalidRequestError`)."""
    return valid_id(conversation_id, "conversation_id")


def valid_tenant(value: object) -> str | None:
    """None, or a tenant's name: a string of 1 to 64 characters."""
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= 64:
        raise refuse("tenant", "None or a string of 1 to 64 characters", value)
    check(value, "tenant")
    return value


def timeout(value: object, name: str = "timeout") -> float | None:
    """None (no bound), or seconds: a number, not negative, not NaN."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise refuse(name, "None or a number of seconds >= 0", value)
    return math.inf if value > 1e300 else float(value)  # an int past float's range


def since(value: object) -> int:
    """An event sequence number to resume after (None: from the start)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEQ:
        raise refuse("since", f"None or an integer from 0 to {MAX_SEQ}", value)
    return value


def flag(value: object, field: str) -> bool:
    """A bool argument (``deltas``)."""
    if not isinstance(value, bool):
        raise refuse(field, "a bool", value)
    return value


def job_request(
    agent: str | AgentSpec,
    input: str,
    conversation_id: str | None,
    context_data: dict[str, Any] | None,
    idempotency_key: str | None,
    budget: Budget | None,
    priority: int,
    tenant: str | None = None,
) -> JobRequest:
    """``submit``'s arguments as a request (else :class:`InvalidRequestError`)."""
    if valid_tenant(tenant) is not None and conversation_id is not None:
        raise InvalidRequestError(
            "tenant: only a job that starts a conversation takes one; a conversation "
            "belongs to its root's tenant",
            ["tenant"],
        )
    try:
        return JobRequest(
            agent=agent,
            input=input,
            conversation_id=conversation_id,
            context_data=context_data or {},
            idempotency_key=idempotency_key,
            budget=budget,
            priority=priority,
            tenant=tenant,
        )
    except ValidationError as exc:
        raise invalid(exc, "job request") from None


def message_options(
    context_data: dict[str, Any] | None, budget: Budget | None, priority: int | None
) -> MessageOptions:
    """``send``'s options (else :class:`InvalidRequestError`)."""
    try:
        return MessageOptions(context_data=context_data, budget=budget, priority=priority)
    except ValidationError as exc:
        raise invalid(exc, "message") from None
