"""Which of the turns a client's ``result()`` waiters wait for have ended.

A waiter wakes on its turn's terminal event from the live stream. A publish
lost between commit and Redis would leave it asleep, so Postgres is also
read after quiet periods; one read per waiter per period would cost a
client with hundreds of waiters hundreds of reads a second. Instead one
background thread asks, every :data:`EVERY` seconds, which of ALL the
waited-on turns have finished (one statement), and wakes those waiters.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import String, any_, bindparam, select
from sqlalchemy.dialects.postgresql import ARRAY

from orchestrator.runtime import Runtime
from orchestrator.store.dialect import binds_arrays
from orchestrator.store.tables import Turn, table
from schemas import TurnStatus

log = logging.getLogger(__name__)

#: Seconds between two checks: the longest a lost publish delays a result.
EVERY = 1.0
#: Turns named in one statement.
CHUNK = 500

_TURN = table(Turn)
_FINISHED = _TURN.c.status != TurnStatus.RUNNING.value
#: Built once (their cache keys are memoized, so each run skips
#: construction). Postgres: the ids as one array parameter, so the SQL text
#: is the same whatever their number; an expanding ``IN`` (SQLite) renders
#: and parses a new statement per count.
ENDED_ANY = select(_TURN.c.id).where(
    _TURN.c.id == any_(bindparam("ids", type_=ARRAY(String))), _FINISHED
)
ENDED_IN = select(_TURN.c.id).where(_TURN.c.id.in_(bindparam("ids", expanding=True)), _FINISHED)


class TurnEnds:
    """Checks the watched turns in Postgres on one background thread.

    Args:
        runtime: the client's runtime (its database).
        every: seconds between checks.
    """

    def __init__(self, runtime: Runtime, every: float = EVERY) -> None:
        self._runtime = runtime
        self._every = every
        self._lock = threading.Condition()
        self._watched: dict[str, set[Callable[[], None]]] = {}
        self._thread: threading.Thread | None = None
        self._closed = False

    @contextmanager
    def watch(self, turn_id: str, wake: Callable[[], None]) -> Iterator[None]:
        """Call ``wake`` (from the checking thread) once a check finds the
        turn finished, while the block runs."""
        with self._lock:
            idle = not self._watched
            self._watched.setdefault(turn_id, set()).add(wake)
            if self._thread is None or not self._thread.is_alive():
                self._closed = False
                self._thread = threading.Thread(
                    target=self._run, name="chorus-turn-ends", daemon=True
                )
                self._thread.start()
            elif idle:  # the thread sleeps until there is a turn to watch;
                # a busier one keeps its period (a burst of waiters is one check)
                self._lock.notify_all()
        try:
            yield
        finally:
            with self._lock:
                wakes = self._watched.get(turn_id)
                if wakes is not None:
                    wakes.discard(wake)
                    if not wakes:
                        del self._watched[turn_id]

    def close(self) -> None:
        """Stop the checking thread (waiters then read Postgres themselves)."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=self._every * 4)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._watched and not self._closed:
                    self._lock.wait()
                if not self._closed:
                    self._lock.wait(self._every)
                if self._closed:
                    return
                ids = list(self._watched)
            try:
                ended = self._ended(ids)
            except Exception as exc:  # the waiters still read on their own
                log.warning("checking turn ends: %s; retrying", exc)
                continue
            with self._lock:
                wakes = [w for turn_id in ended for w in self._watched.get(turn_id, ())]
            for wake in wakes:
                wake()

    def _ended(self, ids: list[str]) -> list[str]:
        ended: list[str] = []
        with self._runtime.autocommit() as connection:
            statement = ENDED_ANY if binds_arrays(connection) else ENDED_IN
            for start in range(0, len(ids), CHUNK):
                rows = connection.execute(statement, {"ids": ids[start : start + CHUNK]})
                ended.extend(row[0] for row in rows)
        return ended
