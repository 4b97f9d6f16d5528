"""The lease heartbeat: one thread per process keeps every model call's lease alive.

A step holds a lease on its conversation for as long as its model call
runs, however long the provider stays silent (a reasoning model, a reply
that streams only tool-call arguments): the heartbeat renews every lease
held in the process in one UPDATE, every third of the lease (or of the
stall timeout, if shorter). A lease that another copy took over (this
process was paused past its expiry) is marked lost, and its step leaves
without persisting.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from sqlalchemy import bindparam, update

from orchestrator.runtime import Runtime
from orchestrator.store.clock import db_now
from orchestrator.store.tables import Conversation, table

log = logging.getLogger(__name__)

_CONVERSATIONS = table(Conversation)

#: The heartbeat's one UPDATE, built once: by primary key, then owner (no
#: scan of the table); it returns the owners whose leases it extended.
_RENEW = (
    update(_CONVERSATIONS)
    .where(
        _CONVERSATIONS.c.id.in_(bindparam("b_ids", expanding=True)),
        _CONVERSATIONS.c.lease_owner.in_(bindparam("b_owners", expanding=True)),
    )
    .values(lease_until=db_now(bindparam("b_lease")))  # the database's clock
    .returning(_CONVERSATIONS.c.lease_owner)
)


@dataclass
class Lease:
    """One model call's lease; ``lost`` is set once another owner holds it."""

    conversation_id: str
    owner: str
    lost: threading.Event = field(default_factory=threading.Event)


class Heartbeat:
    """Renews the leases of the model calls in flight in this process."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._leases: dict[str, Lease] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0

    @property
    def interval(self) -> float:
        s = self.rt.settings
        return min(s.lease_seconds, s.stall_timeout) / 3

    @contextmanager
    def hold(self, conversation_id: str, owner: str) -> Iterator[Lease]:
        """Keep ``owner``'s lease on the conversation alive inside the block."""
        lease = Lease(conversation_id, owner)
        with self._lock:
            self._leases[owner] = lease
            self._start()
        try:
            yield lease
        finally:
            with self._lock:
                self._leases.pop(owner, None)

    def _start(self) -> None:
        """Start the thread on first use, and again in a forked child."""
        if self._thread is not None and self._thread.is_alive() and self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="chorus-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.interval)
            try:
                self.renew()
            except Exception:  # the database may be away for a moment; try again
                log.warning("could not renew model-call leases", exc_info=True)

    def renew(self) -> None:
        """Extend every held lease in one UPDATE; mark the ones no longer ours lost."""
        with self._lock:
            held = dict(self._leases)
        if not held:
            return
        params = {
            "b_ids": sorted({x.conversation_id for x in held.values()}),
            "b_owners": list(held),
            "b_lease": self.rt.settings.lease_seconds,
        }
        with self.rt.autocommit() as connection:  # one statement: its own transaction
            kept = set(connection.execute(_RENEW, params).scalars())
        for owner, lease in held.items():
            if owner not in kept:
                log.warning("lease of %s lost to another owner", lease.conversation_id)
                lease.lost.set()


_heartbeats: dict[int, Heartbeat] = {}
_heartbeats_lock = threading.Lock()


def heartbeat(rt: Runtime) -> Heartbeat:
    """The process's heartbeat for ``rt`` (one per runtime, made on first use)."""
    with _heartbeats_lock:
        beat = _heartbeats.get(id(rt))
        if beat is None:
            beat = _heartbeats[id(rt)] = Heartbeat(rt)
        return beat
