"""One reader of live event streams and one checker of turn ends per
:class:`~orchestrator.async_client.AsyncClient`, as tasks of its event loop.

The asyncio counterparts of :mod:`orchestrator.streams` and
:mod:`orchestrator.turn_ends`: ten thousand coroutines awaiting
``result()`` share ONE blocking ``XREAD`` (on one Redis connection) naming
every followed stream, and ONE statement a second asking Postgres which of
their turns ended; each waiter sleeps on its own :class:`asyncio.Event`.
The same statements, cursors and delivery as the blocking client's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import redis
import redis.asyncio as aioredis
from sqlalchemy.ext.asyncio import AsyncEngine

from orchestrator.errors import ClientClosedError
from orchestrator.streams import BLOCK_MS, ERROR_PAUSE, GATHER, Entry, Followed, deliver, wanted
from orchestrator.turn_ends import CHUNK, ENDED_ANY, EVERY

log = logging.getLogger(__name__)

#: Seconds a client's close waits for each Redis client to close.
CLOSE_WITHIN = 5.0


async def _stop(task: asyncio.Task[None] | None, changed: asyncio.Event) -> None:
    """Cancel ``task`` (a reader's or checker's loop, its owner marked closed)
    and wait for its end: at most :data:`CLOSE_WITHIN` seconds. redis-py can
    swallow the cancellation of a blocking read (redis/redis-py#2028), and the
    loop would then wait for work forever; the closed mark and the wake-up
    end it at its next turn."""
    if task is None:
        return
    task.cancel()
    changed.set()
    with contextlib.suppress(asyncio.CancelledError, TimeoutError):
        await asyncio.wait_for(task, CLOSE_WITHIN)


class AsyncSubscription:
    """The entries of one stream since this subscription started (only
    those of events called ``names``, if given)."""

    def __init__(self, names: frozenset[str] | None = None) -> None:
        self._names = names
        self._entries: list[Entry] = []
        self._woken = False
        self._closed = False
        self._ready = asyncio.Event()

    def push(self, entries: list[Entry]) -> None:
        """Keep the wanted ``entries`` and wake the waiter."""
        entries = wanted(entries, self._names)
        if entries:
            self._entries.extend(entries)
            self._ready.set()

    def wake(self) -> None:
        """End the current (or next) :meth:`wait` now, even without entries."""
        self._woken = True
        self._ready.set()

    def close(self) -> None:
        """Its reader closed: the current (or next) :meth:`wait` raises."""
        self._closed = True
        self._ready.set()

    async def wait(self, timeout: float) -> list[Entry]:
        """The entries that arrived since the last call, waiting up to
        ``timeout`` seconds for one (or a :meth:`wake`); empty when none came.
        Raises :class:`~orchestrator.errors.ClientClosedError` once its
        client is closed (a waiter would otherwise poll on for good)."""
        if not self._entries and not self._woken and not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), max(0.0, timeout))
        if self._closed:
            raise ClientClosedError("the AsyncClient was closed while this waited")
        entries, self._entries, self._woken = self._entries, [], False
        self._ready.clear()
        return entries


class AsyncStreamReader:
    """Reads every followed stream with one ``XREAD`` at a time, on one
    connection, in one task; short commands (a stream's tail) share a pool
    of at most four connections.

    Args:
        url: the Redis URL.
        name: the connections' client name (``CLIENT LIST`` shows it).
    """

    def __init__(self, url: str, name: str) -> None:
        self._streams: dict[str, Followed[AsyncSubscription]] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._commands = aioredis.Redis(
            connection_pool=aioredis.BlockingConnectionPool.from_url(
                url, decode_responses=True, max_connections=4, timeout=None, client_name=name
            )
        )
        # a pool of one, not a single-connection client: a read cancelled
        # by close() drops its connection instead of holding a lock
        self._reader = aioredis.Redis(
            connection_pool=aioredis.ConnectionPool.from_url(
                url, decode_responses=True, max_connections=1, client_name=name
            )
        )

    @asynccontextmanager
    async def subscribe(
        self, stream: str, names: frozenset[str] | None = None
    ) -> AsyncIterator[AsyncSubscription]:
        """Follow ``stream`` from its current end while the block runs."""
        if self._closed:
            raise ClientClosedError("the AsyncClient is closed")
        subscription = AsyncSubscription(names)
        followed = self._streams.get(stream)
        if followed is None:  # one already followed keeps its (earlier) cursor: no read
            tail: Any = await self._commands.xrevrange(stream, count=1)
            followed = self._streams.setdefault(
                stream, Followed(str(tail[0][0]) if tail else "0-0")
            )
        followed.subscriptions.add(subscription)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="chorus-async-streams")
        self._changed.set()
        try:
            yield subscription
        finally:
            followed.subscriptions.discard(subscription)
            if not followed.subscriptions and self._streams.get(stream) is followed:
                del self._streams[stream]

    async def close(self) -> None:
        """Stop the reading task, end its waiters, close the connections."""
        self._closed = True
        for followed in self._streams.values():
            for subscription in followed.subscriptions:
                subscription.close()
        await _stop(self._task, self._changed)
        for client in (self._reader, self._commands):
            with contextlib.suppress(TimeoutError):  # never hang a close
                await asyncio.wait_for(client.aclose(), CLOSE_WITHIN)

    async def _run(self) -> None:
        while not self._closed:
            if not self._streams:
                self._changed.clear()
                await self._changed.wait()
                continue
            cursors: dict[Any, Any] = {s: f.cursor for s, f in self._streams.items()}
            try:
                reply: Any = await self._reader.xread(cursors, count=500, block=BLOCK_MS)
            except redis.RedisError as exc:
                log.warning("live event reader: %s; retrying", exc)
                await asyncio.sleep(ERROR_PAUSE)
                continue
            if reply:
                deliver(self._streams, reply)
                await asyncio.sleep(GATHER)


class AsyncTurnEnds:
    """Checks the watched turns in Postgres in one task, every ``every`` seconds.

    Args:
        engine: the client's async engine.
        every: seconds between checks.
    """

    def __init__(self, engine: AsyncEngine, every: float = EVERY) -> None:
        self._engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._every = every
        self._watched: dict[str, set[Callable[[], None]]] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @contextmanager
    def watch(self, turn_id: str, wake: Callable[[], None]) -> Iterator[None]:
        """Call ``wake`` once a check finds the turn finished, while the block runs."""
        self._watched.setdefault(turn_id, set()).add(wake)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="chorus-async-turn-ends")
        self._changed.set()
        try:
            yield
        finally:
            wakes = self._watched.get(turn_id)
            if wakes is not None:
                wakes.discard(wake)
                if not wakes:
                    del self._watched[turn_id]

    async def close(self) -> None:
        """Stop the checking task."""
        self._closed = True
        await _stop(self._task, self._changed)

    async def _run(self) -> None:
        while not self._closed:
            if not self._watched:
                self._changed.clear()
                await self._changed.wait()
                continue
            await asyncio.sleep(self._every)
            try:
                ended = await self._ended(list(self._watched))
            except Exception as exc:  # the waiters still read on their own
                log.warning("checking turn ends: %s; retrying", exc)
                continue
            for wake in [w for turn_id in ended for w in self._watched.get(turn_id, ())]:
                wake()

    async def _ended(self, ids: list[str]) -> list[str]:
        ended: list[str] = []
        async with self._engine.connect() as connection:
            for start in range(0, len(ids), CHUNK):
                rows = await connection.execute(ENDED_ANY, {"ids": ids[start : start + CHUNK]})
                ended.extend(row[0] for row in rows)
        return ended
