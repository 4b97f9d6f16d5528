"""Events: stored in the transaction of the change they describe, then published.

:class:`Outbox` collects the events of one transaction. ``record`` writes
each with the next per-root sequence number (a row lock on the root
conversation orders concurrent writers); after commit, ``publish`` sends
them to the root's Redis Stream for live followers. Postgres stays the
source of truth: a follower that misses a live entry reads it from there.
"""

from __future__ import annotations

import logging
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
    """Events of one transaction, published once it committed."""

    events: list[Event] = field(default_factory=list)

    def record(
        self,
        session: Session,
        name: EventName,
        conv: Conversation,
        turn: Turn,
        step: int | None = None,
        **data: Any,
    ) -> Event:
        """Store an event about ``conv`` in ``turn`` with the root's next sequence."""
        seq = session.execute(
            update(Conversation)
            .where(col(Conversation.id) == conv.root_id)
            .values(event_seq=col(Conversation.event_seq) + 1)
            .returning(col(Conversation.event_seq))
        ).scalar_one()
        row = EventRow(
            root_id=conv.root_id,
            seq=seq,
            name=name.value,
            conversation_id=conv.id,
            turn_id=turn.id,
            step=step,
            correlation_id=turn.correlation_id,
            data=data,
            created_at=utcnow(),
        )
        session.add(row)
        event = row_to_event(row)
        self.events.append(event)
        return event

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
