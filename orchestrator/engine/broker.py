"""What the Redis broker holds: the sweeper's view of queued and delivered tasks.

Kombu's Redis transport keeps each queue as a list of JSON messages
(``<prefix><queue>``, one more list per priority step:
:func:`orchestrator.celery_conf.queue_lists`) and every message
delivered but not yet acknowledged in the ``<prefix>unacked`` hash, with
its delivery time in the ``<prefix>unacked_index`` sorted set. The prefix
is the ``global_keyprefix`` of :func:`orchestrator.celery_conf.celery_config`.
A task's id is in its message's headers (Celery protocol 2).

Anything in those keys may be malformed (a corrupted write, or anyone with
access to Redis): bytes that are not UTF-8 or not JSON, JSON of another
shape, a key of another type. The view skips what it cannot read, so
that one bad entry never stops the sweeper.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

import redis

from orchestrator.celery_conf import queue_lists
from orchestrator.runtime import Runtime

log = logging.getLogger(__name__)


def _unacked_keys() -> tuple[str, str]:
    """kombu's sorted set and hash of unacknowledged messages (without the
    key prefix). kombu is imported here, by the sweeper, not with the
    engine: a client that imports the engine to submit never loads it."""
    from kombu.transport.redis import Channel

    return Channel.unacked_index_key, Channel.unacked_key


#: Messages read from each queue list per round trip.
_CHUNK = 1000


@dataclass(frozen=True)
class Delivered:
    """A message in the ``unacked`` hash: a worker took it and has not acked."""

    tag: str
    task_id: str
    task: str
    at: float  # epoch seconds of the delivery


def _headers(raw: Any) -> dict[str, Any]:
    """A message's headers; {} if it has none that can be read."""
    try:
        message = json.loads(raw) if isinstance(raw, str | bytes) else raw
        headers = message.get("headers") or {}
    except (ValueError, AttributeError, RecursionError):
        return {}
    return headers if isinstance(headers, dict) else {}


def _unacked_message(value: bytes) -> Any:
    """The message of an unacked hash value (kombu stores ``[message,
    exchange, routing key]`` as JSON); None if the value is not that."""
    try:
        stored = json.loads(value)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return stored[0] if isinstance(stored, list) and stored else None


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


@cache
def _client(url: str) -> redis.Redis:
    # bytes, decoded here: a value that is not UTF-8 must not fail the read
    return redis.Redis.from_url(url)


def _eta(headers: dict[str, Any]) -> float:
    """When a countdown task is due (epoch seconds); 0 without an ETA."""
    eta = headers.get("eta")
    if not isinstance(eta, str):
        return 0.0
    try:
        return datetime.fromisoformat(eta).timestamp()
    except ValueError:
        return 0.0


def broker_client(rt: Runtime) -> redis.Redis | None:
    """A client of the broker's Redis; None when the broker is not Redis
    (then the sweeper cannot look into it and re-dispatches on time alone)."""
    url = rt.settings.broker_url or rt.settings.redis_url
    if url is None or not url.startswith(("redis://", "rediss://", "unix://")):
        return None
    return _client(url)


@dataclass
class BrokerView:
    """One sweep's snapshot of the broker: ids waiting in queues, and
    messages delivered to workers and not acknowledged."""

    client: redis.Redis | None
    prefix: str
    queued: set[str] = field(default_factory=set)
    delivered: list[Delivered] = field(default_factory=list)
    #: (tag, delivery time) of unacked entries that are not a message
    malformed: list[tuple[bytes, float]] = field(default_factory=list)
    _latest: dict[str, float] = field(default_factory=dict)  # task id -> last delivery
    _scanned: set[str] = field(default_factory=set)

    @classmethod
    def read(cls, rt: Runtime, queues: Iterable[str]) -> BrokerView:
        """Read ``queues`` first, then the unacked hash: a message a worker
        takes meanwhile moves from a list to the hash, and is seen in one."""
        view = cls(broker_client(rt), f"{rt.settings.redis_prefix}:")
        if view.client is not None:
            for queue in queues:
                view._scan_queue(queue)
            view._read_unacked()
        return view

    def _key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def _read(self, command: str, key: str, empty: Any, *args: Any, **kwargs: Any) -> Any:
        """``command`` of ``key``, or ``empty`` if the key holds another type."""
        assert self.client is not None
        try:
            return getattr(self.client, command)(key, *args, **kwargs)
        except redis.ResponseError as exc:  # WRONGTYPE: not kombu's key
            log.warning("broker key %s cannot be read (%s); skipped", key, exc)
            return empty

    def _read_unacked(self) -> None:
        index, hashed = (self._key(k) for k in _unacked_keys())
        scored: Any = self._read("zrange", index, [], 0, -1, withscores=True)
        times: dict[str, float] = {_text(tag): score for tag, score in scored}
        stored: dict[bytes, bytes] = self._read("hgetall", hashed, {})
        for raw_tag, value in stored.items():
            tag = _text(raw_tag)
            headers = _headers(_unacked_message(value))
            task_id = headers.get("id")
            at = times.get(tag, time.time())
            if not isinstance(task_id, str):
                self.malformed.append((raw_tag, at))
            else:
                self.delivered.append(Delivered(tag, task_id, str(headers.get("task", "")), at))
                # A worker holds a countdown task until its ETA: it is live until then.
                live = max(at, _eta(headers))
                self._latest[task_id] = max(live, self._latest.get(task_id, live))

    def _scan_queue(self, queue: str) -> None:
        """Read the ids of every message waiting in ``queue`` (once per view)."""
        if self.client is None or queue in self._scanned:
            return
        self._scanned.add(queue)
        for name in queue_lists(queue):
            key = self._key(name)
            start = 0
            while True:
                chunk: list[bytes] = self._read("lrange", key, [], start, start + _CHUNK - 1)
                for raw in chunk:
                    task_id = _headers(raw).get("id")
                    if isinstance(task_id, str):
                        self.queued.add(task_id)
                if len(chunk) < _CHUNK:
                    break
                start += _CHUNK

    def in_flight(self, task_id: str, queue: str, within: float) -> bool:
        """Is a copy of ``task_id`` waiting in ``queue``, or was one handed to
        a worker less than ``within`` seconds ago, or before its ETA (a
        live worker may be about to run it)?"""
        self._scan_queue(queue)
        if task_id in self.queued:
            return True
        return self._latest.get(task_id, 0.0) > time.time() - within

    def waiting(self, task_id: str, queue: str) -> bool:
        """Is a copy of ``task_id`` waiting in ``queue`` (not yet delivered)?"""
        self._scan_queue(queue)
        return task_id in self.queued

    def drop_stale(self, older_than: float, is_done: Callable[[Delivered], bool]) -> int:
        """Remove delivered, unacknowledged messages older than
        ``older_than`` seconds whose work ``is_done``: without this Redis
        would hand them out again after the visibility timeout, as phantom
        work. Entries that are not a message at all go too (kombu's restore
        of unacked messages failed on each, and left those behind it).
        Returns how many were removed."""
        if self.client is None:
            return 0
        ceiling = time.time() - older_than
        stale: list[str | bytes] = [d.tag for d in self.delivered if d.at < ceiling and is_done(d)]
        stale += [tag for tag, at in self.malformed if at < ceiling]
        if stale:
            self._remove(stale)
        return len(stale)

    def _remove(self, tags: Iterable[str | bytes]) -> None:
        assert self.client is not None
        index, hashed = (self._key(k) for k in _unacked_keys())
        pipe = self.client.pipeline()
        for tag in tags:
            pipe.zrem(index, tag)
            pipe.hdel(hashed, tag)
        pipe.execute()
