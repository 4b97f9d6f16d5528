"""The sweeper: re-dispatch the cursor of any turn that stopped moving.

A lost message, a dead worker or a broken chord then costs a delay, never
a conversation. Re-dispatching is safe because every task is idempotent,
and it is rare because the sweeper first looks in the broker: a task of
the position still waiting in a queue (or just handed to a worker) is
merely late, not lost. Each further re-dispatch of one position waits
twice as long as the last, and past ``max_redispatches`` the turn fails.

Each sweep also drops the broker's phantom work (unacknowledged messages
of a dead worker whose position is already done) and starts the next
queued message of any idle conversation whose dequeue was lost, and denies
tool calls whose wait for a person's answer passed its deadline
(:mod:`orchestrator.engine.approvals`; a waiting call is not stalled). It also
finishes stops: a job marked stopping whose turn still runs (the stopping
process died midway), and a job past its wall-time budget whose
``chorus.deadline`` task was lost.

A task waiting in a queue that no worker reads (:mod:`orchestrator.readers`)
is not late but stuck: it is not re-sent (the copy would wait beside it), but
each sweep that finds it counts like a re-dispatch (``queue.unread``), so
the turn fails past ``max_redispatches`` with an error naming the queue.

Every time compared here is the database's (:mod:`orchestrator.store.clock`),
which the workers' writes of those times use too, never this worker's clock.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlmodel import Session

from orchestrator import registry
from orchestrator.celery_conf import QUEUES
from orchestrator.engine.actions import (
    Action,
    Revoke,
    RunSegment,
    RunStep,
    ToolTask,
    advance_task_id,
    position_of,
    step_task_id,
)
from orchestrator.engine.approvals import expire as expire_approvals
from orchestrator.engine.broker import BrokerView, Delivered
from orchestrator.engine.cancel import deadline, resume_stop
from orchestrator.engine.cursor import finish_turn, is_current
from orchestrator.engine.inbox import waiting_inboxes
from orchestrator.engine.subagents import is_subagent_call
from orchestrator.errors import ChorusError, UnknownToolError
from orchestrator.readers import count_readers
from orchestrator.runtime import Runtime
from orchestrator.store.sweep_sql import count_redispatch, jobs_to_stop, position_calls, stalled
from orchestrator.store.tables import (
    AWAITING_APPROVAL,
    CALL_FINISHED,
    Conversation,
    ToolCallRow,
    Turn,
)
from schemas import ConversationState, EventName, TurnStatus

log = logging.getLogger(__name__)


def _tool_timeout(name: str) -> float:
    try:
        return registry.get_tool(name).spec.timeout
    except UnknownToolError:
        return 0.0


def _segment_action(
    session: Session, conv: Conversation, stall: float, now: datetime
) -> Action | None:
    assert conv.turn_id is not None
    calls = position_calls(session, conv.turn_id, conv.cursor_step, conv.cursor_segment)
    for c in calls:
        if c.status != "running":
            continue
        if is_subagent_call(c.tool):
            return None  # its child answers it; the child is swept on its own
        if c.started_at and c.started_at + timedelta(seconds=_tool_timeout(c.tool) + stall) > now:
            return None  # still inside its own timeout
    tasks = tuple(
        ToolTask(c.id, c.tool, c.queue)
        for c in calls
        if c.status not in CALL_FINISHED and c.status != AWAITING_APPROVAL
    )
    if not tasks and any(c.status == AWAITING_APPROVAL for c in calls):
        return None  # waits for a person's answer (engine/approvals.py), not stalled
    finished = [c.finished_at for c in calls if c.finished_at is not None]
    if not tasks and finished and max(finished) + timedelta(seconds=stall) > now:
        return None  # the last call just ended: its worker is sending the advance
    return RunSegment(
        conv.id, conv.turn_id, conv.cursor_step, conv.cursor_segment, tasks, conv.priority
    )


def _position_action(
    session: Session, conv: Conversation, stall: float, now: datetime
) -> Action | None:
    """What serves the conversation's cursor now; None while it is in hand."""
    assert conv.turn_id is not None
    if conv.cursor_segment >= 0:
        return _segment_action(session, conv, stall, now)
    if conv.lease_until is not None and conv.lease_until > now:
        return None  # a live step holds the model-call lease
    return RunStep(conv.id, conv.turn_id, conv.cursor_step, conv.priority)


def _tasks(action: Action) -> list[tuple[str, str]]:
    """The tasks (id, queue) that serve this position."""
    if isinstance(action, RunStep):
        task_id = step_task_id(action.conversation_id, action.turn_id, action.step)
        return [(task_id, QUEUES["chorus.step"])]
    assert isinstance(action, RunSegment)
    if action.calls:
        return [(c.call_id, c.queue) for c in action.calls]
    task_id = advance_task_id(action.conversation_id, action.turn_id, action.step, action.segment)
    return [(task_id, QUEUES["chorus.advance"])]


def _in_flight(broker: BrokerView, action: Action, stall: float) -> bool:
    """Is a task of this position still waiting in the broker (or just
    handed to a worker)? Then it is late, not lost."""
    return any(broker.in_flight(task_id, queue, stall) for task_id, queue in _tasks(action))


def _waiting_in(broker: BrokerView, action: Action) -> list[str]:
    """The queues in which a task of this position waits (not delivered)."""
    return sorted({queue for task_id, queue in _tasks(action) if broker.waiting(task_id, queue)})


def _backed_off(conv: Conversation, now: datetime, stall: float) -> bool:
    """The n-th re-dispatch of one position waits ``stall * 2**n``."""
    wait = timedelta(seconds=stall * 2 ** min(conv.redispatches, 30))
    return conv.progress_at + wait > now


def _give_up(
    rt: Runtime, conversation_id: str, version: int, unread: Sequence[str] = ()
) -> list[Action]:
    """Fail the turn whose position was re-dispatched ``max_redispatches``
    times without moving, or found waiting that often in ``unread``
    queues (a subagent's failure answers its parent)."""
    with rt.transaction() as (session, outbox):
        conv = session.get(Conversation, conversation_id)
        if conv is None or conv.version != version or conv.turn_id is None:
            return []
        turn = session.get(Turn, conv.turn_id)
        assert turn is not None
        where = f"step {conv.cursor_step}" + (
            f" segment {conv.cursor_segment}" if conv.cursor_segment >= 0 else ""
        )
        error = (
            f"{where} made no progress after {conv.redispatches} re-dispatches by the "
            f"sweeper (CHORUS_MAX_REDISPATCHES={rt.settings.max_redispatches}); giving up"
            if not unread
            else f"{where} waited in {_named(unread)}, which no worker reads, through "
            f"{conv.redispatches} sweeps (CHORUS_MAX_REDISPATCHES="
            f"{rt.settings.max_redispatches}); giving up"
        )
        log.warning("turn %s: %s", turn.id, error)
        return finish_turn(session, outbox, conv, turn, TurnStatus.FAILED, error=error) or []


@dataclass(frozen=True)
class _Candidate:
    """A stalled position, as read from the database, and what would re-send it."""

    conversation_id: str
    version: int
    redispatches: int
    action: Action


def _named(queues: Sequence[str]) -> str:
    return ", ".join(f"queue {q!r}" for q in queues)


def _candidate(rt: Runtime, conversation_id: str, now: datetime) -> _Candidate | None:
    stall = rt.settings.stall_timeout
    with rt.session() as session:
        conv = session.get(Conversation, conversation_id)
        if conv is None or conv.state != ConversationState.RUNNING.value or conv.turn_id is None:
            return None
        if _backed_off(conv, now, stall):
            return None
        action = _position_action(session, conv, stall, now)
    if action is None:
        return None
    return _Candidate(conv.id, conv.version, conv.redispatches, action)


def _redispatch(rt: Runtime, candidate: _Candidate, unread: Sequence[str] = ()) -> list[Action]:
    """Re-send the position, or give up on it past ``max_redispatches``;
    nothing if its cursor moved since it was read. A position whose task
    waits in ``unread`` queues is counted the same way but not re-sent:
    ``queue.unread`` says where it waits."""
    if candidate.redispatches >= rt.settings.max_redispatches:
        return _give_up(rt, candidate.conversation_id, candidate.version, unread)
    with rt.transaction() as (session, outbox):
        if not count_redispatch(
            session, candidate.conversation_id, candidate.version, candidate.redispatches
        ):
            return []
        if unread:
            conv = session.get(Conversation, candidate.conversation_id)
            turn = session.get(Turn, conv.turn_id) if conv and conv.turn_id else None
            assert conv is not None and turn is not None
            log.warning("turn %s: waits in %s, which no worker reads", turn.id, _named(unread))
            outbox.record(
                EventName.QUEUE_UNREAD,
                conv,
                turn,
                conv.cursor_step,
                queues=list(unread),
                segment=conv.cursor_segment,
                sweeps=candidate.redispatches + 1,
                limit=rt.settings.max_redispatches,
            )
            return []
    log.info("re-dispatching %s (re-dispatch %d)", candidate.action, candidate.redispatches + 1)
    return [candidate.action]


#: Tasks whose work the sweeper itself redoes once they are stale: a lost
#: dequeue (:func:`waiting_inboxes`) and a sweep (beat sends the next one).
_SWEEPER_COVERS = ("chorus.dequeue", "chorus.sweep")


def _done(session: Session, task: Delivered) -> bool:
    """Is the work of a stale delivered task done, or redone by the sweeper?"""
    position = position_of(task.task_id)
    if position is not None:
        conv = session.get(Conversation, position.conversation_id)
        return not is_current(conv, position.turn_id, position.step, position.segment)
    if task.task in _SWEEPER_COVERS:
        return True
    if task.task == "chorus.tool":
        call = session.get(ToolCallRow, task.task_id)
        if call is None:
            return True
        turn = session.get(Turn, call.turn_id)
        return (
            call.status in CALL_FINISHED or turn is None or turn.status != TurnStatus.RUNNING.value
        )
    return False


def sweep(rt: Runtime, limit: int = 500) -> list[Action]:
    """Re-dispatch the position of each running conversation with no
    progress for ``stall_timeout`` (and none of its tasks in the broker),
    drop phantom broker messages, and dequeue for idle conversations with
    waiting messages. Returns what to dispatch."""
    stall = rt.settings.stall_timeout
    with rt.session() as session:
        now, ids = stalled(session, stall, limit)
    candidates = [c for cid in ids if (c := _candidate(rt, cid, now)) is not None]
    # The broker is read after the database: a task sent after the state we
    # read (its sender commits, then sends) is already in a queue, or the
    # message of the task that sent it is still unacknowledged. The queues
    # are read only when something may need re-sending.
    broker = BrokerView.read(rt, sorted(set(QUEUES.values())) if candidates else ())
    waiting = {c.conversation_id: _waiting_in(broker, c.action) for c in candidates}
    readers = count_readers(rt, sorted({q for queues in waiting.values() for q in queues}))
    actions: list[Action] = []
    for candidate in candidates:
        unread = [q for q in waiting[candidate.conversation_id] if not readers[q]]
        if unread:  # stuck, not late: counted, never re-sent
            actions.extend(_redispatch(rt, candidate, unread))
        elif not _in_flight(broker, candidate.action, stall):
            actions.extend(_redispatch(rt, candidate))
    with rt.session() as session:
        dropped = broker.drop_stale(stall, lambda task: _done(session, task))
    if dropped:
        log.info("dropped %d unacknowledged broker messages of finished work", dropped)
    actions.extend(waiting_inboxes(rt, stall, limit))
    actions.extend(expire_approvals(rt, limit))
    return actions + _finish_stops(rt, limit)


def _finish_stops(rt: Runtime, limit: int) -> list[Action]:
    """Stop what should be stopping: marked jobs still running, and jobs
    whose wall-time budget is spent (:func:`jobs_to_stop`)."""
    with rt.session() as session:
        jobs = jobs_to_stop(session, limit)
    actions: list[Action] = []
    for job in jobs:
        try:
            if job.stop_status is not None:
                revoke, ended = resume_stop(rt, job.id)
                actions += [*ended, Revoke(tuple(revoke))]
            else:
                actions += deadline(rt, job.id)
        except ChorusError:
            log.warning("could not stop job %s; the next sweep tries again", job.id, exc_info=True)
    return actions
