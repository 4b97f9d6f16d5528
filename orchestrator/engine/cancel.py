"""Stopping a job (cancel, budget): its turn and every descendant's.

A job's subagent turns share its correlation id, so the tree is "every
running turn with this correlation id". A stop goes in three durable steps,
each its own short transaction, so it never holds locks a running step
needs and a process dying midway leaves a stop someone else can finish:

1. **Mark** the job's turn (``stop_status``, ``stop_reason``). From then on
   steps, tool calls and advances of the job leave instead of starting
   work; the first mark wins (a cancel racing a budget stop ends the tree
   one way).
2. Set the Redis **flag**: in-flight model calls stop at their next
   streamed chunk, running tool functions within half a second.
3. **End** each running turn, deepest first and the job's own turn last,
   one conversation per transaction: its unfinished tool calls are recorded
   ``cancelled`` (``tool.cancelled``, or ``subagent.stopped`` for a
   subagent call) and the conversation goes idle. The caller revokes the
   returned tool tasks still queued.

The sweeper finishes any marked job whose turn still runs
(:func:`resume_stop`), so a stop whose process died still ends.

Every transaction takes its locks in the one order used everywhere
(docs/architecture.md, "One lock order"): its conversation's row, the
job's root row before any job's turn is written, then calls and turns.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlmodel import Session

from orchestrator.engine.actions import Action, Deadline, Revoke
from orchestrator.engine.budget import exceeded, job_of, wall_time_left
from orchestrator.engine.cursor import finish_turn
from orchestrator.engine.subagents import is_subagent_call
from orchestrator.errors import InvalidRequestError, ServiceUnavailableError
from orchestrator.events import Outbox
from orchestrator.keys import cancelled
from orchestrator.runtime import Runtime
from orchestrator.store.job_totals import lock_job
from orchestrator.store.stop_sql import cancel_calls, mark_stop, running_turns
from orchestrator.store.tables import Conversation, Turn
from schemas import EventName, TurnStatus

log = logging.getLogger(__name__)

#: Tries of one transaction that loses to a deadlock or a lost connection.
DB_ATTEMPTS = 5
#: Rounds of ending turns; a round ends every turn it finds, so more are
#: needed only for children started by tool calls claimed just before the mark.
ROUNDS = 10
#: How long the stop flag outlives the stop.
FLAG_SECONDS = 24 * 3600

T = TypeVar("T")


def retrying(what: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` (one transaction), again after a deadlock or a dropped
    connection; a failure that persists is a :class:`ServiceUnavailableError`."""
    for attempt in range(1, DB_ATTEMPTS + 1):
        try:
            return fn()
        except (OperationalError, redis.RedisError) as exc:
            if attempt == DB_ATTEMPTS:
                raise ServiceUnavailableError(f"{what} failed: {exc}") from exc
            log.warning("%s: attempt %d failed, retrying: %s", what, attempt, exc)
            time.sleep(0.05 * 2**attempt)
        except DBAPIError as exc:
            raise ServiceUnavailableError(f"{what} failed: {exc}") from exc
    raise AssertionError("unreachable")


def stopping(session: Session, turn: Turn) -> bool:
    """Is the job this turn belongs to being stopped? (Its tasks then leave.)"""
    return job_of(session, turn).stop_status is not None


def cancel_watch(rt: Runtime, correlation_id: str, every: float = 0.2) -> Callable[[], bool]:
    """True once the job is stopping; asks Redis at most every ``every`` s,
    first ``every`` s from now: its callers (a step's lease, a tool's claim)
    have read the job's stop mark in Postgres, which a stop sets before the
    Redis flag, shortly before (a step: at most a checkpoint's model call
    before), so a stop since is seen at most ``every`` s late."""
    key = cancelled(rt.settings.redis_prefix, correlation_id)
    last = time.monotonic()

    def should_stop() -> bool:
        nonlocal last
        now = time.monotonic()
        if now - last < every:
            return False
        last = now
        try:
            return bool(rt.redis.exists(key))
        except redis.RedisError:
            log.warning("could not read the stop flag", exc_info=True)
            return False

    return should_stop


def deadline(rt: Runtime, job_id: str) -> list[Action]:
    """``chorus.deadline``: stop the job (``budget.exceeded``, turn failed)
    if its wall-time budget is spent; look again later if it is not yet."""
    with rt.session() as session:
        job = session.get(Turn, job_id)
        conv = session.get(Conversation, job.conversation_id) if job is not None else None
    if job is None or conv is None or job.status != TurnStatus.RUNNING.value:
        return []
    left = wall_time_left(job)
    if left is None:
        return []
    if left > 0:
        return [Deadline(job_id, min(left, rt.settings.visibility_timeout / 2), conv.priority)]
    reason = exceeded(job) or "wall time budget exceeded"
    revoke, actions = stop_tree(rt, job_id, TurnStatus.FAILED, reason, budget=True)
    return [*actions, Revoke(tuple(revoke))]


def cancel(rt: Runtime, job_id: str) -> tuple[list[str], list[Action]]:
    """Cancel the job's tree. Returns the tool call ids (= task ids) to
    revoke and what to dispatch next (the root conversation's dequeue).
    Idempotent: a finished job has nothing left to cancel."""
    return stop_tree(rt, job_id, TurnStatus.CANCELLED, "cancelled")


def stop_tree(
    rt: Runtime, job_id: str, status: TurnStatus, reason: str, *, budget: bool = False
) -> tuple[list[str], list[Action]]:
    """End every running turn of the job's tree with ``status`` and ``reason``
    (``budget``: record ``budget.exceeded`` with the mark). A job already
    being stopped ends the way its first stop said."""
    job = retrying("marking the stop", lambda: _mark(rt, job_id, status, reason, budget))
    if job is None:
        return [], []
    return _finish(rt, job)


def resume_stop(rt: Runtime, job_id: str) -> tuple[list[str], list[Action]]:
    """Finish a marked stop (its process may have died midway)."""
    with rt.session() as session:
        job = session.get(Turn, job_id)
    if job is None or job.stop_status is None or job.status != TurnStatus.RUNNING.value:
        return [], []
    return _finish(rt, job)


def _mark(rt: Runtime, job_id: str, status: TurnStatus, reason: str, budget: bool) -> Turn | None:
    """Mark the running job; returns it (with the mark that won) or None if it ended."""
    with rt.transaction() as (session, outbox):
        turn = session.get(Turn, job_id)
        if turn is None:
            raise InvalidRequestError(f"no job {job_id!r}", ["job_id"])
        job = job_of(session, turn)  # a subagent's turn stops its whole job
        lock_job(session, job.id)
        marked = mark_stop(session, job.id, status.value, reason)
        session.refresh(job)
        if job.status != TurnStatus.RUNNING.value:
            return None
        if budget and marked:
            conv = session.get(Conversation, job.conversation_id)
            assert conv is not None
            outbox.record(
                EventName.BUDGET_EXCEEDED, conv, job, job.steps, reason=reason, job_id=job.id
            )
        return job


def _finish(rt: Runtime, job: Turn) -> tuple[list[str], list[Action]]:
    assert job.stop_status is not None
    status, reason = TurnStatus(job.stop_status), job.stop_reason or job.stop_status
    retrying(
        "setting the stop flag",
        lambda: rt.redis.set(
            cancelled(rt.settings.redis_prefix, job.correlation_id), job.id, ex=FLAG_SECONDS
        ),
    )
    revoke: list[str] = []
    actions: list[Action] = []
    for _ in range(ROUNDS):
        running = retrying("listing the tree's turns", lambda: _running(rt, job))
        if not running:
            return revoke, actions
        # the job's own turn ends only once a fresh read finds nothing else
        # running, so its end is the tree's last event
        running = [t for t in running if t.id != job.id] or running
        for turn in running:
            end = functools.partial(_end_turn, rt, turn.id, status, reason)
            calls, nxt = retrying("ending a stopped turn", end)
            revoke += calls
            actions += nxt
    log.warning(
        "job %s: turns still running after %d rounds; the sweeper ends them", job.id, ROUNDS
    )
    return revoke, actions


def _running(rt: Runtime, job: Turn) -> list[Turn]:
    """The tree's running turns: deepest first, the job's own turn last, so
    the job's end is the tree's last event."""
    with rt.session() as session:
        rows = running_turns(session, job.correlation_id)
    ordered = sorted(rows, key=lambda r: (r[0].id == job.id, -r[1], -r[0].started_at.timestamp()))
    return [turn for turn, _depth in ordered]


def _end_turn(
    rt: Runtime, turn_id: str, status: TurnStatus, reason: str
) -> tuple[list[str], list[Action]]:
    """End one running turn in its own transaction: lock its conversation
    first, then (a job's turn) the job's root row, then its calls, then the turn."""
    with rt.transaction() as (session, outbox):
        turn = session.get(Turn, turn_id)
        assert turn is not None
        conv = session.get(
            Conversation, turn.conversation_id, with_for_update=True, populate_existing=True
        )
        assert conv is not None
        session.refresh(turn)
        if turn.status != TurnStatus.RUNNING.value or conv.turn_id != turn.id:
            return [], []
        if turn.job_id in (None, turn.id) and conv.id != conv.root_id:
            lock_job(session, turn.id)  # a job's turn: the root's row before its calls
        calls = _cancel_calls(session, outbox, conv, turn)
        ended = finish_turn(session, outbox, conv, turn, status, error=reason, notify_parent=False)
        assert ended is not None, "the conversation row is locked: its cursor cannot move"
        return calls, ended


def _cancel_calls(session: Session, outbox: Outbox, conv: Conversation, turn: Turn) -> list[str]:
    cancelled_calls = cancel_calls(session, turn.id)
    for call in sorted(cancelled_calls, key=lambda c: (c.step, c.id)):
        outbox.record_call(
            EventName.SUBAGENT_STOPPED if is_subagent_call(call.tool) else EventName.TOOL_CANCELLED,
            conv,
            turn,
            call,
        )
    return [c[0] for c in cancelled_calls]
