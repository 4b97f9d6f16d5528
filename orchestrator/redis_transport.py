"""Kombu's Redis transport, with one Redis client per channel, and a worker
that survives its broker.

* Kombu's Redis channel builds a new ``redis.Redis`` for every command it
  sends outside its consumer: each task publish, each acknowledgement, each
  task event a worker sends (a step's six tasks: about 30 a step). Building
  one copies redis-py's table of response callbacks, several hundred
  entries, which cost a worker more CPU than the commands. A ``redis.Redis``
  on a connection pool is safe to share between threads (each command
  takes a connection from the pool), so this channel builds its client once.
* A channel keeps the parameters of its connection (a Redis restart killed
  every worker holding a task: :meth:`Channel._connparams`).
* A channel closed because its connection was lost keeps the messages of
  the tasks still running (:meth:`QoS.restore_unacked`).
* A message popped from a queue that cannot be decoded or delivered is
  logged, counted and dropped (it killed the worker:
  :meth:`Channel._brpop_read`); a key of the wrong type where the channel
  reads or writes a list, a hash or a sorted set is moved aside (it killed
  every worker of the queue, again after each restart).

Everything else is kombu's transport as it is. Used for ``redis://`` brokers
(:func:`orchestrator.celery_conf.celery_config`).
"""

from __future__ import annotations

import logging
import time
from queue import Empty
from typing import Any

import redis as redis_py
from celery.worker import state
from kombu.transport import redis

from orchestrator.keys import dropped_messages

log = logging.getLogger(__name__)

#: What a failed read from the broker raises, for the consumer to reconnect:
#: kombu's connection and channel errors, but KeyError, which kombu counts
#: among them (for a stale descriptor) and a message without its
#: properties raises too.
BROKER_ERRORS: tuple[type[BaseException], ...] = (
    Empty,
    *(
        e
        for e in (*redis.Transport.connection_errors, *redis.Transport.channel_errors)
        if e is not KeyError
    ),
)


class QoS(redis.QoS):
    def restore_unacked(self, client: Any = None) -> Any:
        """Put the channel's unacknowledged messages back on their queues,
        but those of tasks still running, unless the worker is shutting down.

        Kombu restores every message a channel holds when it closes. Celery
        closes the channel when the broker connection is lost, but a task
        that is running goes on: restored, its message was taken by another
        slot and the running tool ran twice at once. Its message now stays
        in the unacknowledged set, and its task acknowledges it when it ends
        (if the worker dies first, Redis hands it out again after the
        visibility timeout, and the sweeper re-sends its position before).
        The others (received but not started, held until their countdown)
        are restored at once as before, and so is everything when the worker
        stops.
        """
        flags = (state.should_stop, state.should_terminate)  # an exit status once set (0 too)
        if all(flag is None or flag is False for flag in flags):
            running = {r.message.delivery_tag for r in tuple(state.active_requests)}
            kept = running.intersection(self._delivered)
            for tag in kept:
                del self._delivered[tag]
            if kept:
                log.info("kept %d message(s) of running tasks unacknowledged", len(kept))
        return super().restore_unacked(client)


class Channel(redis.Channel):
    QoS = QoS
    _shared: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._params: dict[bool, dict[str, Any]] = {}
        super().__init__(*args, **kwargs)  # opens the asynchronous pool: its parameters
        self._connparams()  # and those of the synchronous pool, while the connection has them

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        """The parameters of a new pool, read from the connection once.

        Kombu reads them from ``self.connection.client``, which a collected
        connection sets to None (``kombu.Connection.collect``, on a broker
        connection lost). The channel outlives that: Celery closes it again
        (which restores its unacknowledged messages) and a task still
        running acknowledges its message on it once it ends. Both build a
        new pool, and kombu raised AttributeError, which killed the worker
        ("Unrecoverable error ... 'hostname'"). With the parameters kept,
        they reach Redis, or fail with a connection error that Celery
        handles (docs/architecture.md, Known issues).
        """
        if asynchronous not in self._params:
            self._params[asynchronous] = super()._connparams(asynchronous=asynchronous)
        return dict(self._params[asynchronous])

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)
        if self._shared is None:
            self._shared = super()._create_client()
        return self._shared

    def _disconnect_pools(self) -> None:
        """Kombu drops its pools (closing, after a fork, on a failed
        ping): the client built on the old pool goes with them."""
        self._shared = None
        super()._disconnect_pools()

    def _brpop_read(self, **options: Any) -> Any:
        """Read the message a BRPOP popped and deliver it.

        Anything but a broker error (:data:`BROKER_ERRORS`) raised while
        decoding or delivering it (bytes that are not JSON, an envelope
        without its properties or delivery info, nesting past the recursion
        limit, a task name Celery cannot look up) concerns that one message
        only: kombu let it end the worker ("Unrecoverable error"), so anyone
        able to push to a queue could stop the fleet. Such a message is
        already off its list; it is logged, counted under
        :func:`orchestrator.keys.dropped_messages` and dropped (if it reached
        the unacknowledged set, it is taken out again), and the worker goes
        on. A message Celery itself refuses (an unknown
        task, a content type not accepted) never gets here: Celery logs and
        acknowledges it.
        """
        delivered = self.qos._delivered
        last = next(reversed(delivered), None)
        try:
            return super()._brpop_read(**options)
        except redis_py.ResponseError as exc:
            if "WRONGTYPE" not in str(exc) or not self._move_aside():
                raise
            raise Empty() from exc
        except BROKER_ERRORS:
            raise
        except Exception as exc:
            newest = next(reversed(delivered), None)
            if newest is not None and newest != last:
                self.qos.reject(newest, requeue=False)  # out of the unacked set
            self._drop(exc)
            raise Empty() from exc  # as kombu does with a fanout message it cannot decode

    #: The type of each key of the channel's (besides its queue lists).
    _KEY_TYPES = {
        redis.Channel.unacked_key: "hash",
        redis.Channel.unacked_index_key: "zset",
    }

    def _move_aside(self) -> int:
        """Rename each key of the channel that holds the wrong type (a
        WRONGTYPE reply to BRPOP, or to delivering a message, which writes
        the unacked hash and index) to ``<key>:wrongtype:<time>``, logged
        and counted like a dropped message: left there it failed every
        BRPOP of every worker reading the queue, and kombu ended each one
        ("Unrecoverable error"). A message popped when delivering it failed
        is lost with the error (the sweeper re-sends its work). Returns how
        many keys were moved."""
        keys = {
            f"{self.global_keyprefix}{self._q_for_pri(queue, step)}": "list"
            for queue in self.active_queues
            for step in self.priority_steps
        }
        keys.update({f"{self.global_keyprefix}{k}": t for k, t in self._KEY_TYPES.items()})
        client = redis_py.Redis(connection_pool=self.pool)
        moved = 0
        for key, expected in keys.items():
            found = client.type(key)
            found = found.decode() if isinstance(found, bytes) else found
            if found in (expected, "none"):
                continue
            aside = f"{key}:wrongtype:{time.time():.6f}"
            try:
                client.rename(key, aside)
            except redis_py.ResponseError:  # gone meanwhile
                continue
            log.error("broker key %s held a %s, not a %s: moved to %s", key, found, expected, aside)
            moved += 1
        for _ in range(moved):
            self._count()
        return moved

    def _drop(self, exc: Exception) -> None:
        excerpt = getattr(exc, "doc", None)  # the text, if it was not JSON
        log.error(
            "dropped a broker message that cannot be decoded or delivered: %r%s",
            exc,
            f" (message starts {excerpt[:200]!r})" if isinstance(excerpt, str) else "",
            exc_info=exc,
        )
        self._count()

    def _count(self) -> None:
        """Count one more dropped message (or key moved aside)."""
        key = dropped_messages(self.global_keyprefix.removesuffix(":"))
        try:
            redis_py.Redis(connection_pool=self.pool).incr(key)
        except redis_py.RedisError:  # the counter itself may be of the wrong type
            log.warning("could not count the dropped message in %s", key, exc_info=True)


class Transport(redis.Transport):
    Channel = Channel
