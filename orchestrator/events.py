"""Events: stored in the transaction of the change they describe, then published.

:class:`Outbox` collects the events of one transaction. ``record`` writes
each with the next per-root sequence number (a row lock on the root
conversation orders concurrent writers); after commit, ``publish`` sends
them to the root's Redis Stream for live followers. Postgres stays the
source of truth: a follower that misses a live entry reads it from there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from sqlalchemy import update
from sqlmodel import Session, col

from orchestrator.keys import events_stream
from orchestrator.store.tables import Conversation, EventRow, Turn, utcnow
from schemas import Event, EventName

log = logging.getLogger(__name__)


def row_to_event(row: EventRow) -> Event:
    return Event(
        name=EventName(row.name),
        conversation_id=row.conversation_id,
        root_id=row.root_id,
        turn_id=row.turn_id,
        step=row.step,
        correlation_id=row.correlation_id,
        time=row.created_at,
        seq=row.seq,
        data=row.data,
    )


@dataclass
class Outbox:
    """Events of one transaction: numbered and stored just before it commits
    (:meth:`flush`), published once it has (:meth:`publish`).

    Reserving every sequence number of the transaction with one update of
    the root row keeps that row's lock short: concurrent tool calls of one
    tree queue on it only for the commit, not for the whole transaction.
    """

    pending: list[EventRow] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    def record(
        self,
        name: EventName,
        conv: Conversation,
        turn: Turn | None,
        step: int | None = None,
        **data: Any,
    ) -> None:
        """Add an event about ``conv`` in ``turn`` to this transaction
        (``turn`` None: a conversation that never ran a turn)."""
        self.pending.append(
            EventRow(
                root_id=conv.root_id,
                seq=0,
                name=name.value,
                conversation_id=conv.id,
                turn_id=turn.id if turn else None,
                step=step,
                correlation_id=turn.correlation_id if turn else None,
                data=data,
                created_at=utcnow(),
            )
        )

    def discard(self) -> None:
        """Forget the pending events (their transaction is rolled back)."""
        self.pending.clear()

    def flush(self, session: Session) -> None:
        """Number the pending events per root and add them to ``session``."""
        roots: dict[str, list[EventRow]] = {}
        for row in self.pending:
            roots.setdefault(row.root_id, []).append(row)
        for root_id, rows in roots.items():
            last = session.execute(
                update(Conversation)
                .where(col(Conversation.id) == root_id)
                .values(event_seq=col(Conversation.event_seq) + len(rows))
                .returning(col(Conversation.event_seq))
            ).scalar_one()
            for offset, row in enumerate(rows):
                row.seq = last - len(rows) + 1 + offset
            session.add_all(rows)
        self.events.extend(row_to_event(r) for r in self.pending)
        self.pending.clear()

    def publish(self, client: redis.Redis, prefix: str, maxlen: int) -> None:
        """Send to the live streams; a Redis failure is logged, never raised:
        the events are already stored."""
        if not self.events:
            return
        try:
            pipe = client.pipeline(transaction=False)
            for event in self.events:
                pipe.xadd(
                    events_stream(prefix, event.root_id),
                    {"e": event.model_dump_json()},
                    maxlen=maxlen,
                    approximate=True,
                )
            pipe.execute()
        except redis.RedisError:
            log.warning("could not publish %d events live", len(self.events), exc_info=True)
        self.events.clear()


def publish_live(client: redis.Redis, prefix: str, maxlen: int, event: Event) -> None:
    """Publish a live-only event (a delta); lost deltas cost nothing durable."""
    try:
        client.xadd(
            events_stream(prefix, event.root_id),
            {"e": event.model_dump_json()},
            maxlen=maxlen,
            approximate=True,
        )
    except redis.RedisError:
        log.debug("could not publish a live event", exc_info=True)


class DeltaBatcher:
    """Coalesces a stream's text pieces into few live events.

    The first piece goes out at once (time to first token), then pieces
    collected for at least ``interval`` seconds go out as one text: a few
    Redis writes a second per stream instead of one per chunk. Call
    :meth:`flush` when the stream ends, whatever way it ends. Not
    thread-safe: one batcher per stream, fed by the thread reading it.
    """

    def __init__(
        self,
        publish: Callable[[str], None],
        interval: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._publish = publish
        self._interval = interval
        self._clock = clock
        self._pieces: list[str] = []
        self._sent_at: float | None = None

    def add(self, text: str) -> None:
        """Take a piece; publish what is pending if ``interval`` has passed."""
        self._pieces.append(text)
        if self._sent_at is None or self._clock() - self._sent_at >= self._interval:
            self.flush()

    def flush(self) -> None:
        """Publish what is pending, if anything."""
        if not self._pieces:
            return
        text = "".join(self._pieces)
        self._pieces.clear()
        self._sent_at = self._clock()
        self._publish(text)
