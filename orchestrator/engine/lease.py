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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from orchestrator.periodic import Periodic
from orchestrator.runtime import Runtime
from orchestrator.store.step_sql import renew_leases

log = logging.getLogger(__name__)


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
        self._beat: Periodic | None = None
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
        """Start the thread on first use, and again in a forked child (the
        parent's thread does not run there)."""
        if self._beat is not None and self._pid == os.getpid():
            return
        self._pid = os.getpid()
        failing = "could not renew model-call leases"
        self._beat = Periodic("chorus-lease", self.interval, self.renew, failing).start()

    def renew(self) -> None:
        """Extend every held lease in one UPDATE; mark the ones no longer ours lost."""
        with self._lock:
            held = dict(self._leases)
        if not held:
            return
        ids = sorted({x.conversation_id for x in held.values()})
        with self.rt.autocommit() as connection:
            kept = renew_leases(connection, ids, list(held), self.rt.settings.lease_seconds)
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
