"""``/v1/runs``: what a run viewer needs beyond ``/v1/jobs`` (the dashboard
is one such client).

- ``GET /v1/runs``: the jobs page of ``GET /v1/jobs`` (same filters, same
  cursor), each job with its tree's steps, tool calls, tokens, cost, duration
  and the start of its input; ``text`` keeps the jobs whose input holds it.
- ``GET /v1/runs/{job_id}``: the job's tree (every conversation under its
  root that served it, with usage and state) and its budget.
- ``GET /v1/runs/{job_id}/events``: the job's stored events a page at a time
  (``after`` a seq, up to ``limit``), so a viewer opens a run of 10,000
  events without following a stream to its end; live ones come over
  ``GET /v1/jobs/{job_id}/events`` resumed after the last seq read here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, TypeAdapter
from sqlalchemy import func, or_
from sqlalchemy import select as sql_select
from sqlmodel import Session, col, select

from orchestrator.client import MAX_SEQ
from orchestrator.errors import InvalidRequestError
from orchestrator.events import row_to_event, visible_below
from orchestrator.server import jobs, tenants
from orchestrator.server.auth import Reader, client_of
from orchestrator.server.errors import COMMON, responses
from orchestrator.server.models import JobPage, JobSummary
from orchestrator.server.params import JobId
from orchestrator.store.tables import Conversation, EventRow, Turn
from orchestrator.store.values import check
from schemas import Event, EventName, JobStatus, TurnStatus, Usage

router = APIRouter(prefix="/v1/runs", tags=["runs"], responses=responses(*COMMON))

#: Characters of a job's input shown in a list.
INPUT_PREVIEW = 200
#: Most events in one page.
MAX_EVENTS_PAGE = 5000


class RunSummary(JobSummary):
    """A job of a list, with its whole tree's counts."""

    input: str
    steps: int
    tool_calls: int
    subagents: int
    usage: Usage
    seconds: float | None = None


class RunPage(BaseModel):
    runs: list[RunSummary]
    next_cursor: str | None = None


class TreeNode(BaseModel):
    """A conversation of the job's tree."""

    conversation_id: str
    parent_id: str | None
    kind: str
    agent: str
    depth: int
    status: TurnStatus | None
    steps: int
    usage: Usage


class RunTree(BaseModel):
    job: JobStatus
    budget: dict[str, Any] | None = None
    steps: int
    tool_calls: int
    subagents: int
    #: Stored events of the job (its subagents' included).
    events: int
    started_at: datetime
    finished_at: datetime | None = None
    conversations: list[TreeNode]


class EventPage(BaseModel):
    """Stored events in seq order; ``next_after``: ask again after it (None: no more now)."""

    events: list[Event]
    next_after: int | None = None


_PAGE = TypeAdapter(EventPage)


def _seconds(turn: Turn) -> float | None:
    if turn.finished_at is None:
        return None
    return round((turn.finished_at - turn.started_at).total_seconds(), 3)


def _tree_usage(turn: Turn) -> Usage:
    return Usage(
        input_tokens=turn.tree_input_tokens,
        output_tokens=turn.tree_output_tokens,
        cost_usd=turn.tree_cost_usd,
    )


@router.get("", response_model=RunPage)
def list_runs(found: Annotated[JobPage, Depends(jobs.list_jobs)], request: Request) -> RunPage:
    """Top-level jobs, newest first (the page ``GET /v1/jobs`` answers, with
    its filters), with their trees' counts."""
    client = client_of(request)
    ids = [job.job_id for job in found.jobs]
    with client.runtime.session() as session:
        turns = {t.id: t for t in session.exec(select(Turn).where(col(Turn.id).in_(ids))).all()}
    runs = [
        RunSummary(
            **job.model_dump(),
            input=turns[job.job_id].input_text[:INPUT_PREVIEW],
            steps=turns[job.job_id].tree_steps,
            tool_calls=turns[job.job_id].tree_tool_calls,
            subagents=turns[job.job_id].tree_children,
            usage=_tree_usage(turns[job.job_id]),
            seconds=_seconds(turns[job.job_id]),
        )
        for job in found.jobs
    ]
    return RunPage(runs=runs, next_cursor=found.next_cursor)


@router.get("/{job_id}", response_model=RunTree)
def tree(job_id: JobId, principal: Reader, request: Request) -> RunTree:
    """The job, its budget, and every conversation of its tree that served it."""
    client = client_of(request)
    job = tenants.job(client, principal, job_id)
    status = job.status()
    with client.runtime.session() as session:
        turn = session.get(Turn, job.id)
        assert turn is not None  # tenants.job found it
        turns = session.exec(
            select(Turn).where(or_(col(Turn.job_id) == job.id, col(Turn.id) == job.id))
        ).all()
        by_conversation = {t.conversation_id: t for t in turns}
        conversations = session.execute(  # not the agent specs: columns the tree shows
            sql_select(
                col(Conversation.id),
                col(Conversation.parent_id),
                col(Conversation.kind),
                col(Conversation.depth),
                col(Conversation.created_at),
            ).where(col(Conversation.id).in_(list(by_conversation)))
        ).all()
        nodes = [
            TreeNode(
                conversation_id=cid,
                parent_id=parent if cid != job.conversation_id else None,
                kind=kind,
                agent=by_conversation[cid].agent,
                depth=depth,
                status=by_conversation[cid].status,
                steps=by_conversation[cid].steps,
                usage=Usage(
                    input_tokens=by_conversation[cid].input_tokens,
                    output_tokens=by_conversation[cid].output_tokens,
                    cost_usd=by_conversation[cid].cost_usd,
                ),
            )
            for cid, parent, kind, depth, _ in sorted(
                conversations, key=lambda c: (c[3], c[4], c[0])
            )
        ]
        return RunTree(
            job=status,
            budget=turn.budget,
            steps=turn.tree_steps,
            tool_calls=turn.tree_tool_calls,
            subagents=turn.tree_children,
            events=session.exec(
                _events_of(session, job.id, job.root_id).with_only_columns(func.count())
            ).one(),
            started_at=turn.started_at,
            finished_at=turn.finished_at,
            conversations=nodes,
        )


#: Event names a ``names`` filter may list.
NAMES = ",".join(n.value for n in EventName)


@router.get("/{job_id}/events", response_model=EventPage)
def events(
    job_id: JobId,
    principal: Reader,
    request: Request,
    after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_EVENTS_PAGE)] = 1000,
    conversation_id: Annotated[
        str | None, Query(max_length=64, description="Only this conversation's.")
    ] = None,
    names: Annotated[
        str | None, Query(max_length=2000, description=f"Comma-separated, of: {NAMES}.")
    ] = None,
    newest: Annotated[
        bool, Query(description="The last ``limit`` events (still in seq order).")
    ] = False,
) -> Response:
    """The job's stored events after ``after`` (its subagents' included), in
    seq order, optionally of one conversation or of some names only. A page
    never leaves out an event that could still commit below its last seq, so
    ``next_after`` is safe to resume from (here or on the job's stream)."""
    client = client_of(request)
    job = tenants.job(client, principal, job_id)
    with client.runtime.session() as session:
        query = _events_of(session, job.id, job.root_id).where(EventRow.seq > after)
        if conversation_id is not None:
            check(conversation_id, "conversation_id")
            query = query.where(EventRow.conversation_id == conversation_id)
        if names is not None:
            query = query.where(col(EventRow.name).in_(_names(names)))
        order = col(EventRow.seq).desc() if newest else col(EventRow.seq)
        rows = list(session.exec(query.order_by(order).limit(limit + 1)).all())
    more = len(rows) > limit and not newest
    rows = sorted(rows[:limit], key=lambda r: r.seq)
    found = [row_to_event(r) for r in rows]
    page = EventPage(events=found, next_after=found[-1].seq if more and found else None)
    # serialized at once (not re-validated against the response model): a
    # page of thousands of events is the common case here
    return Response(_PAGE.dump_json(page), media_type="application/json")


def _names(names: str) -> list[str]:
    found = [n.strip() for n in names.split(",") if n.strip()]
    known = {n.value for n in EventName}
    unknown = [n for n in found if n not in known]
    if unknown:
        raise InvalidRequestError(f"names: no event is named {unknown[0][:64]!r}", ["names"])
    return found


def _events_of(session: Session, job_id: str, root_id: str) -> Any:
    """The select of the job's stored events (those that can no longer be
    preceded by one committing later)."""
    turn = session.get(Turn, job_id)
    assert turn is not None  # tenants.job found it
    query = select(EventRow).where(
        EventRow.root_id == root_id, EventRow.correlation_id == turn.correlation_id
    )
    bound = visible_below(session)
    return query if bound is None else query.where(bound)
