"""Which broker queues some worker reads.

Each worker announces the queues it consumes in Redis every
:data:`ANNOUNCE_EVERY` seconds (:func:`announce`, from a thread of the
worker's main process), each announcement good for :data:`GOOD_FOR`
seconds on Redis's own clock, and withdraws it when it shuts down. The
sweeper reads them to tell a task waiting its turn in a backlog from one
waiting in a queue that no worker reads (a typo in a tool's ``queue``, a
worker fleet started without it), which would otherwise wait forever;
``chorus queues`` and the ``chorus_queue_readers`` gauge show them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import redis

from orchestrator import keys, registry
from orchestrator.celery_conf import PRIORITY_STEPS, QUEUES, queue_lists
from orchestrator.periodic import Periodic
from orchestrator.runtime import Runtime

log = logging.getLogger(__name__)

#: Seconds between a worker's announcements.
ANNOUNCE_EVERY = 10.0
#: Seconds an announcement holds: a worker that stops announcing (killed)
#: stops counting as a reader after this.
GOOD_FOR = 3 * ANNOUNCE_EVERY


def _redis_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return float(seconds) + float(micros) / 1e6


def announce(rt: Runtime, node: str, queues: Iterable[str]) -> None:
    """Record that ``node`` reads ``queues`` for the next :data:`GOOD_FOR` seconds."""
    client, prefix = rt.redis, rt.settings.redis_prefix
    until = _redis_now(client) + GOOD_FOR
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.zadd(keys.readers(prefix, queue), {node: until})
        pipe.zremrangebyscore(keys.readers(prefix, queue), "-inf", f"({until - GOOD_FOR}")
    pipe.execute()


def withdraw(rt: Runtime, node: str, queues: Iterable[str]) -> None:
    """``node`` no longer reads ``queues`` (it is shutting down)."""
    pipe = rt.redis.pipeline(transaction=False)
    for queue in queues:
        pipe.zrem(keys.readers(rt.settings.redis_prefix, queue), node)
    pipe.execute()


def count_readers(rt: Runtime, queues: Sequence[str]) -> dict[str, int]:
    """How many workers announced each of ``queues`` and still hold it."""
    if not queues:
        return {}
    client, prefix = rt.redis, rt.settings.redis_prefix
    now = _redis_now(client)
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.zcount(keys.readers(prefix, queue), f"({now}", "+inf")
    return dict(zip(queues, (int(n) for n in pipe.execute()), strict=True))


class Announcer(Periodic):
    """A worker's thread announcing its queues until :meth:`stop`."""

    def __init__(self, rt: Runtime, node: str, queues: Iterable[str]) -> None:
        self.rt, self.node, self.queues = rt, node, sorted(set(queues))
        super().__init__(
            "chorus-readers",
            ANNOUNCE_EVERY,
            lambda: announce(self.rt, self.node, self.queues),
            "could not announce the queues this worker reads",
        )

    def stop(self) -> None:
        super().stop()
        try:
            withdraw(self.rt, self.node, self.queues)
        except redis.RedisError:  # the announcement then expires on its own
            log.warning("could not withdraw this worker's queues", exc_info=True)


class QueueState(NamedTuple):
    """A broker queue: messages waiting (every priority list) and workers reading it."""

    queue: str
    waiting: int
    readers: int


def known_queues() -> list[str]:
    """Chorus's queues, and any queue a registered tool names."""
    tools = (registry.get_tool(n).spec.queue for n in registry.tool_names())
    return sorted({*QUEUES.values(), *tools})


def queue_states(rt: Runtime, queues: Sequence[str]) -> list[QueueState]:
    """What waits in each of ``queues`` (in the broker, Chorus's Redis) and who reads it."""
    prefix = rt.settings.redis_prefix
    pipe = rt.redis.pipeline(transaction=False)
    for queue in queues:
        for name in queue_lists(queue):
            pipe.llen(f"{prefix}:{name}")
    sizes = pipe.execute()
    steps = len(PRIORITY_STEPS)
    readers = count_readers(rt, queues)
    return [
        QueueState(q, sum(sizes[i * steps : (i + 1) * steps]), readers[q])
        for i, q in enumerate(queues)
    ]
