"""One reader of the live event streams for every waiter of a client.

A web server's ``Client`` may have a thousand threads in ``result()`` or
``events()`` at once. Each holding its own blocking ``XREAD`` would need a
Redis connection per waiter (redis-py's pool stops at 100). Instead one
background thread reads every followed stream with a single ``XREAD`` on one
connection and hands each entry to the subscriptions of its stream; a waiter
sleeps on its own condition and touches Redis only through this reader.
Short commands (a new stream's tail) share a small blocking pool, so a burst
of subscribers waits for a connection instead of failing.

The stream is only a wake-up: waiters read every stored event from
Postgres, and re-read it after a quiet period, so an entry the reader misses
(Redis restarted, a publish lost) costs a delay, never an event.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import redis

from orchestrator.events import ENTRY_NAME

log = logging.getLogger(__name__)

#: One stream entry: its id and fields.
Entry = tuple[str, dict[str, str]]

#: How long one XREAD blocks; also the longest a newly followed stream waits
#: before the reader includes it (its cursor is fixed at subscription, so no
#: entry is missed meanwhile).
BLOCK_MS = 250
#: Pause after a Redis error before the reader tries again.
ERROR_PAUSE = 1.0
#: Pause after a read that returned entries, so that the next one gathers
#: what arrives meanwhile: each XREAD names every followed stream (its
#: cost grows with the waiters), so while entries keep coming one read
#: per pause instead of one per entry. A live entry waits at most this long.
GATHER = 0.02


def wanted(entries: list[Entry], names: frozenset[str] | None) -> list[Entry]:
    """The entries of events called ``names`` (all, if None), and those
    without a name field."""
    if names is None:
        return entries
    return [e for e in entries if e[1].get(ENTRY_NAME, "") in names or ENTRY_NAME not in e[1]]


class Subscription:
    """The entries of one stream since this subscription started.

    Args:
        names: if given, only entries of events so named (by the entry's
            ``n`` field) are kept and wake the waiter; the others are dropped
            unparsed. An entry without that field is kept.
    """

    def __init__(self, names: frozenset[str] | None = None) -> None:
        self._names = names
        self._entries: list[Entry] = []
        self._woken = False
        self._ready = threading.Condition()

    def push(self, entries: list[Entry]) -> None:
        """Keep the wanted ``entries`` and wake the waiter."""
        entries = wanted(entries, self._names)
        if not entries:
            return
        with self._ready:
            self._entries.extend(entries)
            self._ready.notify_all()

    def wake(self) -> None:
        """End the current (or next) :meth:`wait` now, even without entries:
        something other than the stream says the waiter should look."""
        with self._ready:
            self._woken = True
            self._ready.notify_all()

    def wait(self, timeout: float) -> list[Entry]:
        """The entries that arrived since the last call, waiting up to
        ``timeout`` seconds for one (or a :meth:`wake`); empty when none came."""
        with self._ready:
            if not self._entries and not self._woken:
                self._ready.wait(max(0.0, timeout))
            entries, self._entries, self._woken = self._entries, [], False
            return entries


class Pushed(Protocol):
    """What a stream's entries are handed to."""

    def push(self, entries: list[Entry]) -> None: ...


S = TypeVar("S", bound=Pushed)


@dataclass
class Followed(Generic[S]):
    """A followed stream: where its next read starts, and who gets its entries."""

    cursor: str
    subscriptions: set[S] = field(default_factory=set)


class StreamReader:
    """Reads every followed stream on one background thread.

    Args:
        url: the Redis URL.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._lock = threading.Condition()
        self._streams: dict[str, Followed[Subscription]] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        self._commands = redis.Redis(
            connection_pool=redis.BlockingConnectionPool.from_url(
                url, decode_responses=True, max_connections=4, timeout=None
            )
        )

    @contextmanager
    def subscribe(self, stream: str, names: frozenset[str] | None = None) -> Iterator[Subscription]:
        """Follow ``stream`` from its current end while the block runs
        (only the events called ``names``, if given)."""
        subscription = Subscription(names)
        tail = self._tail(stream)  # outside the lock: a Redis round trip
        with self._lock:
            # A stream already followed keeps its (earlier) cursor: the new
            # waiter may see a few entries from before it came, never fewer.
            followed = self._streams.setdefault(stream, Followed(tail))
            followed.subscriptions.add(subscription)
            self._start()
            self._lock.notify_all()
        try:
            yield subscription
        finally:
            with self._lock:
                followed.subscriptions.discard(subscription)
                if not followed.subscriptions and self._streams.get(stream) is followed:
                    del self._streams[stream]

    def close(self) -> None:
        """Stop the reader thread (waiters then fall back to polling Postgres)."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=BLOCK_MS / 1000 * 4)
        self._commands.close()

    def _tail(self, stream: str) -> str:
        tail: Any = self._commands.xrevrange(stream, count=1)
        return str(tail[0][0]) if tail else "0-0"

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._closed = False
            self._thread = threading.Thread(target=self._run, name="chorus-streams", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        reader = redis.Redis.from_url(self._url, decode_responses=True)
        try:
            while True:
                with self._lock:
                    while not self._streams and not self._closed:
                        self._lock.wait()
                    if self._closed:
                        return
                    cursors: dict[Any, Any] = {s: f.cursor for s, f in self._streams.items()}
                try:
                    reply: Any = reader.xread(cursors, count=500, block=BLOCK_MS)
                except redis.RedisError as exc:
                    log.warning("live event reader: %s; retrying", exc)
                    time.sleep(ERROR_PAUSE)
                    continue
                if reply:
                    self._deliver(reply)
                    time.sleep(GATHER)
        finally:
            reader.close()

    def _deliver(self, reply: list[tuple[str, list[Entry]]]) -> None:
        with self._lock:
            deliver(self._streams, reply)


def deliver(streams: dict[str, Followed[Any]], reply: list[tuple[str, list[Entry]]]) -> None:
    """Hand each stream's entries of an XREAD ``reply`` to its subscriptions
    and move its cursor past them."""
    for stream, entries in reply:
        followed = streams.get(stream)
        if followed is None or not entries:
            continue
        followed.cursor = entries[-1][0]
        for subscription in followed.subscriptions:
            subscription.push(entries)
