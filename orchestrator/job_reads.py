"""How both clients read a job: its status row, its stored events, the
end of its turn, and the live deltas a follower holds back.

Shared by :mod:`orchestrator.client` (blocking) and
:mod:`orchestrator.async_client`: statements built once, pure decisions,
and reads that take a session (the async client runs them on its async
driver through SQLAlchemy's greenlet bridge).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple, TypeVar

from pydantic import BaseModel, ValidationError
from sqlalchemy import bindparam
from sqlmodel import Session, col, select

from orchestrator import registry
from orchestrator.errors import JobFailedError, NoStructuredOutputError, invalid
from orchestrator.events import (
    CUT,
    ENTRY_EVENT,
    committed_horizon,
    row_to_event,
    snapshot_bound,
    visible_below,
)
from orchestrator.store.tables import EventRow, Turn, table
from schemas import TERMINAL_TURN_EVENTS, Event, JobStatus, TurnStatus, Usage

#: Quiet seconds before a waiter re-reads Postgres anyway (a publish lost
#: between commit and Redis costs at most this delay); doubles while nothing
#: happens, up to the maximum, so a thousand idle waiters stay cheap.
QUIET_POLL = 1.0
QUIET_POLL_MAX = 10.0
#: First pause before reading again when an event announced live is stored
#: but not yet readable (a transaction older than it still runs); doubles
#: up to ``QUIET_POLL``.
CATCH_UP = 0.01


class Unsettled(Exception):
    """A bounded wait for older transactions (:func:`within`) ran out."""


def within(
    seconds: float, pause: Callable[[float], float] = lambda wanted: wanted
) -> Callable[[float], float]:
    """A ``pause`` for :func:`settle` that raises :class:`Unsettled` once
    ``seconds`` from now have passed; each pause is also put through
    ``pause`` (a caller's own deadline)."""
    until = time.monotonic() + seconds

    def bounded(wanted: float) -> float:
        left = until - time.monotonic()
        if left <= 0:
            raise Unsettled
        return min(pause(wanted), left)

    return bounded


def settle(session: Session, pause: Callable[[float], float]) -> None:
    """Return once a read of stored events in ``session`` sees every
    transaction committed before this call. ``pause`` turns the wanted pause
    into the one to sleep (and raises when the caller's time is spent)."""
    horizon = committed_horizon(session)
    wanted = CATCH_UP
    while horizon is not None and snapshot_bound(session) < horizon:
        session.rollback()
        time.sleep(pause(wanted))
        wanted = min(QUIET_POLL, wanted * 2)


_TURN = table(Turn)
#: What a job's status reads, built once (its cache key is memoized) and
#: run as Core: the columns it shows, not the whole ORM row.
STATUS = select(
    *(
        _TURN.c[name]
        for name in (
            "id",
            "conversation_id",
            "root_id",
            "agent",
            "status",
            "steps",
            "output",
            "structured",
            "error",
            "input_tokens",
            "output_tokens",
            "cost_usd",
            "tree_input_tokens",
            "tree_output_tokens",
            "tree_cost_usd",
        )
    )
).where(_TURN.c.id == bindparam("id"))
#: The events that end a turn, by the name their stream entries carry
#: (whole, or cut: too large for an entry).
TERMINAL_NAMES = frozenset(
    name for event in TERMINAL_TURN_EVENTS for name in (event.value, CUT + event.value)
)


class JobIds(NamedTuple):
    """The ids a job's reads need."""

    id: str
    conversation_id: str
    root_id: str


def job_status(turn: Any) -> JobStatus:
    """A row of :data:`STATUS` as the job's status."""
    return JobStatus(
        job_id=turn.id,
        conversation_id=turn.conversation_id,
        root_id=turn.root_id,
        agent=turn.agent,
        status=TurnStatus(turn.status),
        step=turn.steps,
        output=turn.output,
        structured=turn.structured,
        error=turn.error,
        usage=Usage(
            input_tokens=turn.input_tokens,
            output_tokens=turn.output_tokens,
            cost_usd=turn.cost_usd,
        ),
        tree_usage=Usage(
            input_tokens=turn.tree_input_tokens,
            output_tokens=turn.tree_output_tokens,
            cost_usd=turn.tree_cost_usd,
        ),
    )


def is_end(job: JobIds, event: Event) -> bool:
    """Is ``event`` the end of ``job``'s turn?"""
    return (
        event.turn_id == job.id
        and event.conversation_id == job.conversation_id
        and event.name in TERMINAL_TURN_EVENTS
    )


def end_entry(job: JobIds, fields: Mapping[str, str]) -> Event | None:
    """The live stream entry's event, if it ends ``job``'s turn."""
    event = Event.model_validate_json(fields[ENTRY_EVENT])
    return event if is_end(job, event) else None


def answer(job_id: str, ended: JobStatus | Event) -> str:
    """The final answer of an ended turn (its end event, or its status);
    :class:`~orchestrator.errors.JobFailedError` unless it completed."""
    if isinstance(ended, Event):  # the end event carries status, output and error
        status, output, error = (ended.data.get(k) for k in ("status", "output", "error"))
    else:
        status, output, error = ended.status.value, ended.output, ended.error
    if status != TurnStatus.COMPLETED.value:
        raise JobFailedError(job_id, str(status), error)
    return output or ""


def stored_events(
    session: Session,
    root_id: str,
    correlation_id: str,
    after: int,
    held: HeldDeltas | None = None,
) -> list[Event]:
    """The turn's stored events after ``after``, in order, up to the bound
    below which nothing can commit any more (so resuming after the last one
    never skips an event that commits later). ``held``: told, before the
    read, how far it reaches (:meth:`HeldDeltas.catch_up`)."""
    if held is not None:
        held.catch_up(session)
    query = select(EventRow).where(
        EventRow.root_id == root_id,
        EventRow.seq > after,
        EventRow.correlation_id == correlation_id,
    )
    bound = visible_below(session)
    if bound is not None:
        query = query.where(bound)
    rows = session.exec(query.order_by(col(EventRow.seq))).all()
    return [row_to_event(r) for r in rows]


class HeldDeltas:
    """Live deltas a follower holds until it has yielded the stored events
    committed before they came (a step's ``llm.requested`` precedes its
    text): those announced live before a delta (their seq), and, for a
    follower that joined while older transactions still ran (a call under
    way, its ``llm.requested`` not readable yet), every event numbered
    below the cluster's horizon when it joined.

    Each delta waits for a ``mark``: it is yielded once every stored event
    below it is, that is before the first stored event at or above it, or
    after a read that reached it."""

    def __init__(self, horizon: int | None) -> None:
        self.horizon = horizon or 0  # 0: nothing to wait for
        self.caught_up = self.horizon == 0
        self.deltas: deque[tuple[int, Event]] = deque()

    def catch_up(self, session: Session) -> None:
        """Before a read of stored events: the read returns every event
        below the horizon if its bound has passed it (bounds only grow)."""
        if not self.caught_up and snapshot_bound(session) >= self.horizon:
            self.caught_up = True

    def waiting(self) -> bool:
        """Are deltas held for events committed before the follower joined?"""
        return bool(self.deltas) and not self.caught_up

    def _through(self, last: int) -> int:
        """Every stored event below this is yielded (``last``: the latest)."""
        return max(last + 1, self.horizon if self.caught_up else 0)

    def add(self, announced: int, delta: Event, last: int) -> Iterator[Event]:
        """Hold ``delta``, which came after the events announced up to
        ``announced``; yield what is due."""
        mark = announced + 1 if self.caught_up else max(announced + 1, self.horizon)
        self.deltas.append((mark, delta))
        return self._due(self._through(last))

    def _due(self, through: int) -> Iterator[Event]:
        while self.deltas and self.deltas[0][0] <= through:
            yield self.deltas.popleft()[1]

    def after(self, stored: list[Event], last: int) -> Iterator[Event]:
        """``stored`` (one read, after ``last``), each event preceded by the
        held deltas it lets go, and then those the whole read lets go."""
        for event in stored:
            last = event.seq or last
            yield from self._due(last)
            yield event
        yield from self._due(self._through(last))


class Follow:
    """Where a follower of a job's events stands: the last event it
    yielded, the highest announced live, the deltas it holds. Its loop (a
    thread's or a coroutine's) reads stored events and waits for live ones;
    this decides what each brings."""

    def __init__(
        self, job: JobIds, correlation_id: str, last: int, held: HeldDeltas, deltas: bool
    ) -> None:
        self.job = job
        self.correlation_id = correlation_id
        self.last = last
        self.announced = last  # the highest seq seen live
        self.held = held
        self.deltas = deltas

    def stored(self, events: list[Event]) -> tuple[list[Event], bool]:
        """What one read of stored events lets the follower yield, and
        whether the turn's end is among them (nothing after it is yielded)."""
        out: list[Event] = []
        for event in self.held.after(events, self.last):
            self.last = event.seq or self.last
            out.append(event)
            if is_end(self.job, event):
                return out, True
        return out, False

    def rest(self, events: list[Event]) -> list[Event]:
        """The last read of a finished turn: all of it."""
        return list(self.held.after(events, self.last))

    def behind(self) -> bool:
        """Was an event announced live that no read has returned yet (or
        are deltas held for events older than the follower)?"""
        return self.announced > self.last or self.held.waiting()

    def live(self, events: list[Event]) -> tuple[list[Event], bool]:
        """The deltas due among live ``events``, and whether a stored event
        was announced that the follower has not read yet."""
        out: list[Event] = []
        stale = False
        for event in events:
            if event.correlation_id != self.correlation_id:
                continue
            if event.seq is None:
                if self.deltas:
                    out.extend(self.held.add(self.announced, event, self.last))
            elif event.seq > self.last:
                self.announced = max(self.announced, event.seq)
                stale = True
        return out, stale


M = TypeVar("M", bound=BaseModel)


def typed_output(status: JobStatus, model: type[M] | None = None) -> M | Any:
    """A completed job's structured answer: validated into ``model`` if
    given; else into the ``output`` model the agent holding the turn was
    declared with in this process (``Agent(output=Model)``); else, in a
    process that did not declare it (a client importing no agent module),
    the validated JSON as the workers stored it (a dict).

    Raises :class:`~orchestrator.errors.NoStructuredOutputError` if the job
    has none (its agent declares no output), and
    :class:`~orchestrator.errors.InvalidRequestError` if the answer does
    not validate as ``model``."""
    if status.structured is None:
        raise NoStructuredOutputError(status.job_id, status.agent)
    cls = model if model is not None else registry.output_model(status.agent)
    if cls is None:
        return status.structured
    try:
        return cls.model_validate(status.structured)
    except ValidationError as exc:
        raise invalid(exc, f"output of job {status.job_id} as {cls.__name__}") from None
