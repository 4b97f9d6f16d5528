"""``/v1/jobs``: submit, read, cancel, list and follow jobs."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from orchestrator.client import Job
from orchestrator.errors import JobFailedError, JobNotFinishedError, ServiceUnavailableError
from orchestrator.server import follow, listing, sse, tenants
from orchestrator.server.auth import Reader, Submitter, client_of, still_valid
from orchestrator.server.errors import COMMON, responses
from orchestrator.server.models import JobCreated, JobPage, JobResult, JobUsage, SubmitRequest
from orchestrator.server.params import Deltas, JobId, ResumeAfter, TraceParent
from orchestrator.store.token_sql import Principal
from schemas import JobStatus, TurnStatus

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=responses(*COMMON))

#: Longest ``wait`` of a result request, in seconds.
MAX_WAIT = 30.0
#: Most result requests of one server process waiting at once. Each holds
#: a thread of the pool every route runs in (anyio's, 40 threads): past
#: this, a request that would wait for a running job is refused with 503,
#: so that waits never hold the threads the other requests need.
MAX_WAITING = 20
_WAITING = threading.BoundedSemaphore(MAX_WAITING)


def idempotency_key(tenant: str, key: str) -> str:
    """The stored key of an HTTP submit's ``key``: the tenant's own, in a
    namespace no other key uses (a queued message's turn is keyed
    ``inbox:<conversation>:<entry>``, which a tenant named ``inbox`` would
    otherwise reach)."""
    return f"tenant:{tenant}:{key}"


@router.post("", status_code=201, response_model=JobCreated)
def submit(
    body: SubmitRequest, principal: Submitter, request: Request, trace_parent: TraceParent
) -> JobCreated:
    """Start a turn of a registered agent. A second submit with the same
    ``idempotency_key`` (by the same tenant) returns the first job. A valid
    W3C ``traceparent`` header makes the job's trace part of the caller's."""
    client = client_of(request)
    if body.conversation_id is not None:
        tenants.conversation(client, principal, body.conversation_id)
    # a new conversation is the token's tenant's from the transaction that stores it
    owner = principal.tenant if body.conversation_id is None else None
    key = body.idempotency_key
    job = client.submit(
        body.agent,
        body.input,
        conversation_id=body.conversation_id,
        context_data={**body.context_data, "tenant": principal.tenant},
        idempotency_key=None if key is None else idempotency_key(principal.tenant, key),
        budget=body.budget,
        priority=body.priority,
        trace_parent=trace_parent,
        tenant=owner,
    )
    return JobCreated(job_id=job.id, conversation_id=job.conversation_id, root_id=job.root_id)


@router.get("", response_model=JobPage)
def list_jobs(
    principal: Reader,
    request: Request,
    status: TurnStatus | None = None,
    agent: Annotated[str | None, Query(max_length=64)] = None,
    tenant: Annotated[str | None, Query(max_length=64)] = None,
    since: Annotated[datetime | None, Query(description="Started at or after.")] = None,
    until: Annotated[datetime | None, Query(description="Started before.")] = None,
    text: Annotated[str | None, Query(max_length=200, description="In the input.")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=400)] = None,
) -> JobPage:
    """Top-level jobs, newest first. Only an admin token sees other tenants'."""
    return listing.page(
        client_of(request),
        principal,
        status=None if status is None else status.value,
        agent=agent,
        tenant=tenant,
        since=since,
        until=until,
        limit=limit,
        cursor=cursor,
        text=text,
    )


def _job(request: Request, principal: Principal, job_id: str) -> Job:
    return tenants.job(client_of(request), principal, job_id)


@router.get("/{job_id}", response_model=JobStatus)
def status(job_id: JobId, principal: Reader, request: Request) -> JobStatus:
    """Where the job stands: status, step, answer or error, usage."""
    return _job(request, principal, job_id).status()


@router.get("/{job_id}/usage", response_model=JobUsage)
def usage(job_id: JobId, principal: Reader, request: Request) -> JobUsage:
    found = _job(request, principal, job_id).status()
    return JobUsage(usage=found.usage, tree_usage=found.tree_usage)


def _finished(request: Request, principal: Principal, job: Job, wait: float) -> JobStatus:
    """The job's status once it finished completed; waits up to ``wait`` s
    (503 if :data:`MAX_WAITING` requests wait already and the job runs)."""
    if wait > 0:
        if not _WAITING.acquire(blocking=False):
            return _ended(job, busy=True)
        try:
            _wait(request, principal, job, wait)
        finally:
            _WAITING.release()
    return _ended(job)


def _wait(request: Request, principal: Principal, job: Job, wait: float) -> None:
    """Wait up to ``wait`` s for the job's end. The token is checked again
    after every stretch of the wait as long as an open stream's recheck
    (:mod:`orchestrator.server.revocations`) and after the end, so a token
    revoked meanwhile gets a 401 within that bound, never the answer."""
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        try:
            job.result(timeout=min(left, request.app.state.revocations.every))
        except TimeoutError:
            still_valid(request, principal)
            continue
        except JobFailedError:
            pass
        break
    still_valid(request, principal)


def _ended(job: Job, busy: bool = False) -> JobStatus:
    """The job's status if it completed; 409 if it failed, or if it runs
    (503 instead if it was not waited for because every wait was ``busy``)."""
    found = job.status()
    if found.status is TurnStatus.RUNNING:
        if busy:
            raise ServiceUnavailableError(f"{MAX_WAITING} result requests are waiting; retry later")
        raise JobNotFinishedError(job.id)
    if found.status is not TurnStatus.COMPLETED:
        raise JobFailedError(job.id, found.status.value, found.error)
    return found


Wait = Annotated[float, Query(ge=0, le=MAX_WAIT, description="Seconds to wait for the end.")]


@router.get("/{job_id}/result", response_model=JobResult)
def result(job_id: JobId, principal: Reader, request: Request, wait: Wait = 0) -> JobResult:
    """The answer of a completed job (409 while it runs, or if it failed)."""
    found = _finished(request, principal, _job(request, principal, job_id), wait)
    return JobResult(
        job_id=found.job_id,
        status=found.status,
        output=found.output or "",
        structured=found.structured,
    )


@router.get("/{job_id}/output")
def output(job_id: JobId, principal: Reader, request: Request, wait: Wait = 0) -> Any:
    """The structured output of a completed job whose agent has an
    ``output`` model: the JSON it validated against it (null otherwise)."""
    return _finished(request, principal, _job(request, principal, job_id), wait).structured


@router.post("/{job_id}/cancel", response_model=JobStatus)
def cancel(job_id: JobId, principal: Submitter, request: Request) -> JobStatus:
    """Cancel the job and every subagent under it (safe on a finished job)."""
    job = _job(request, principal, job_id)
    job.cancel()
    return job.status()


@router.get("/{job_id}/events", **sse.ROUTE)
def events(
    job_id: JobId,
    principal: Reader,
    request: Request,
    since: ResumeAfter,
    deltas: Deltas = False,
) -> StreamingResponse:
    """The job's events as Server-Sent Events: stored ones, then live ones
    until its turn ends."""
    job = _job(request, principal, job_id)
    return sse.stream(request, principal, follow.job_events(job, since, deltas))
