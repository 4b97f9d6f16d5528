"""Events as an async iterator, for the SSE routes.

The one place that knows how events are read: the sync
:class:`~orchestrator.client.Client` follows a job in a thread of its own
per follower (not the shared thread pool, which a thousand followers would
exhaust) and hands each event to the event loop.

A follower whose client disconnects stops its thread at the next event it
would have sent, or at the follow's next quiet period (at most
``QUIET_POLL_MAX`` seconds). At most ``settings.max_event_streams`` streams
hold a place at once, each from its admission until its follower thread
ends: a stream asked for beyond that is refused with 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator

from sqlmodel import col, select

from orchestrator.client import Client, Job, follow_until
from orchestrator.errors import ServiceUnavailableError
from orchestrator.events import row_to_event, visible_below
from orchestrator.job_reads import Unsettled, settle, within
from orchestrator.store.tables import Conversation, EventRow
from schemas import TERMINAL_TURN_EVENTS, Event

#: At most this long a stream that reached an idle root waits for the
#: transactions older than its last events to end (one held open elsewhere
#: on the server must not hold the stream's thread).
SETTLE_SECONDS = 30.0


class _End:
    """The thread's last word: the error it ended with, if any."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


class _Open:
    """How many event streams hold a place now: each from the moment it is
    admitted (its request answered 200) until its follower thread ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def admit(self, limit: int) -> _Place:
        """A place for one more stream; :class:`ServiceUnavailableError`
        (503) when ``limit`` hold one. Checked and taken at once: streams
        asked for together cannot all pass a check of a count that only
        their threads, started later, would raise."""
        with self._lock:
            if self.count >= limit:
                raise ServiceUnavailableError(
                    f"{limit} event streams are open (CHORUS_MAX_EVENT_STREAMS); retry later"
                )
            self.count += 1
        return _Place(self)

    def _leave(self) -> None:
        with self._lock:
            self.count -= 1


class _Place:
    """An admitted stream's place, given back once (:meth:`leave`): by its
    follower thread when it ends, or, if the stream never started its
    thread (the client left before the first byte), when it is dropped."""

    def __init__(self, open_: _Open) -> None:
        self._open = open_
        self._lock = threading.Lock()
        self._held = True
        self.started = False

    def leave(self) -> None:
        with self._lock:
            held, self._held = self._held, False
        if held:
            self._open._leave()

    def leave_unless_started(self) -> None:
        if not self.started:
            self.leave()


#: This process's event streams.
OPEN = _Open()


def _admitted(
    limit: int, events: Callable[[threading.Event], Iterator[Event]]
) -> AsyncIterator[Event]:
    place = OPEN.admit(limit)
    stream = _threaded(events, place)
    weakref.finalize(stream, place.leave_unless_started)
    return stream


async def _threaded(
    events: Callable[[threading.Event], Iterator[Event]], place: _Place
) -> AsyncIterator[Event]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Event | _End] = asyncio.Queue()
    stop = threading.Event()

    def put(item: Event | _End) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody listens any more
            stop.set()

    def run() -> None:
        try:
            for event in events(stop):
                put(event)
                if stop.is_set():
                    return
        except BaseException as exc:
            put(_End(exc))
        else:
            put(_End())
        finally:
            place.leave()

    place.started = True
    try:
        threading.Thread(target=run, name="chorus-sse-follower", daemon=True).start()
    except BaseException:
        place.leave()
        raise
    try:
        while True:
            item = await queue.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            yield item
    finally:
        stop.set()


def job_events(job: Job, since: int, deltas: bool) -> AsyncIterator[Event]:
    """The job's events after ``since``, live until its turn ends (its last
    ones waited for at most :data:`SETTLE_SECONDS`)."""
    return _admitted(
        job._client.settings.max_event_streams,
        lambda stop: follow_until(job, since, deltas, stop, SETTLE_SECONDS),
    )


def tree_events(client: Client, root_id: str, since: int, deltas: bool) -> AsyncIterator[Event]:
    """Every event of the conversation tree after ``since``: the stored
    ones, then each turn that runs on the root conversation, live, until
    the root is idle (a turn a queued message starts is followed too)."""
    return _admitted(
        client.settings.max_event_streams,
        lambda stop: _tree(client, root_id, since, deltas, stop),
    )


def _tree(
    client: Client, root_id: str, since: int, deltas: bool, stop: threading.Event
) -> Iterator[Event]:
    last = since
    unsettled = False  # a turn followed ended without its last events: the wait is spent
    while not stop.is_set():
        for event in _stored(client, root_id, last):
            last = event.seq or last
            yield event
        with client.runtime.session() as session:
            root = session.get(Conversation, root_id)
            running = root.turn_id if root is not None and root.state == "running" else None
            if running is None and not unsettled:
                # idle: what committed before now may still sort above the
                # visible bound (an older transaction runs); wait for it
                with contextlib.suppress(Unsettled):
                    settle(session, within(SETTLE_SECONDS))
        if running is None:
            yield from _stored(client, root_id, last)
            return
        unsettled = True
        for event in follow_until(client.job(running), last, deltas, stop, SETTLE_SECONDS):
            last = event.seq or last
            unsettled = not (event.turn_id == running and event.name in TERMINAL_TURN_EVENTS)
            yield event


def _stored(client: Client, root_id: str, after: int) -> list[Event]:
    """The tree's stored events after ``after`` that can no longer be
    preceded by one committing later."""
    with client.runtime.session() as session:
        query = select(EventRow).where(EventRow.root_id == root_id, EventRow.seq > after)
        bound = visible_below(session)
        if bound is not None:
            query = query.where(bound)
        rows = session.exec(query.order_by(col(EventRow.seq))).all()
        return [row_to_event(r) for r in rows]
