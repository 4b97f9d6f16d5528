"""``GET /v1/jobs``: top-level jobs, newest first, filtered, a page at a time.

The cursor is opaque to callers: the last row's ``(started_at, id)``,
base64 of JSON; the next page holds the rows strictly after it in that order.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, or_
from sqlmodel import col, select

from orchestrator.client import Client
from orchestrator.errors import InvalidRequestError
from orchestrator.server.models import JobPage, JobSummary
from orchestrator.store.tables import Conversation, Turn
from orchestrator.store.token_sql import Principal, Scope
from orchestrator.store.values import check


def _encode(started_at: datetime, job_id: str) -> str:
    raw = json.dumps([started_at.isoformat(), job_id]).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode(cursor: str) -> tuple[datetime, str]:
    try:
        started, job_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        at = _utc(datetime.fromisoformat(started), "cursor")
        check(job_id, "cursor")
        return at, str(job_id)
    except (ValueError, TypeError, binascii.Error, UnicodeError, RecursionError):
        raise InvalidRequestError("cursor: not a cursor this API returned", ["cursor"]) from None


def _utc(value: datetime, field: str) -> datetime:
    """``value`` in UTC (a naive one is taken as UTC), if Postgres can hold it."""
    try:
        at = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:
        at = None
    if at is None or not 1 < at.year < 9999:
        raise InvalidRequestError(f"{field}: a time between the years 2 and 9998", [field])
    return at


def page(
    client: Client,
    principal: Principal,
    *,
    status: str | None,
    agent: str | None,
    tenant: str | None,
    since: datetime | None,
    until: datetime | None,
    limit: int,
    cursor: str | None,
    text: str | None = None,
) -> JobPage:
    """One page of the jobs this principal may see. A non-admin token sees
    its own tenant's only: a ``tenant`` filter naming another finds none."""
    query: Any = (
        select(Turn, Conversation.tenant)
        .join(Conversation, col(Conversation.id) == col(Turn.root_id))
        .where(col(Turn.conversation_id) == col(Turn.root_id), Conversation.kind == "main")
    )
    if principal.scope is not Scope.ADMIN:
        query = query.where(Conversation.tenant == principal.tenant)
    for column, value, name in (
        (Conversation.tenant, tenant, "tenant"),
        (Turn.status, status, "status"),
        (Turn.agent, agent, "agent"),
    ):
        if value is not None:
            check(value, name)
            query = query.where(column == value)
    if text is not None:
        check(text, "text")
        query = query.where(col(Turn.input_text).icontains(text, autoescape=True))
    if since is not None:
        query = query.where(col(Turn.started_at) >= _utc(since, "since"))
    if until is not None:
        query = query.where(col(Turn.started_at) < _utc(until, "until"))
    if cursor is not None:
        at, job_id = _decode(cursor)
        query = query.where(
            or_(
                col(Turn.started_at) < at,
                and_(col(Turn.started_at) == at, col(Turn.id) < job_id),
            )
        )
    query = query.order_by(col(Turn.started_at).desc(), col(Turn.id).desc()).limit(limit + 1)
    with client.runtime.session() as session:
        rows = session.exec(query).all()
    jobs = [
        JobSummary(
            job_id=turn.id,
            conversation_id=turn.conversation_id,
            agent=turn.agent,
            status=turn.status,
            tenant=owner,
            started_at=turn.started_at,
            finished_at=turn.finished_at,
        )
        for turn, owner in rows[:limit]
    ]
    more = len(rows) > limit
    last = rows[limit - 1][0] if more else None
    return JobPage(jobs=jobs, next_cursor=_encode(last.started_at, last.id) if last else None)
