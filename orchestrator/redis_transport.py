"""Kombu's Redis transport with one Redis client per channel.

Kombu's Redis channel builds a new ``redis.Redis`` for every command it
sends outside its consumer: each task publish, each acknowledgement, each
task event a worker sends (a step's six tasks: about 30 a step). Building
one copies redis-py's table of response callbacks, several hundred
entries, which cost a worker more CPU than the commands. A ``redis.Redis``
on a connection pool is safe to share between threads (each command
takes a connection from the pool), so this channel builds its client once.
Everything else is kombu's transport as it is.

Used for ``redis://`` brokers (:func:`orchestrator.celery_conf.celery_config`).
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis


class Channel(redis.Channel):
    _shared: Any = None

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


class Transport(redis.Transport):
    Channel = Channel
