"""Every Redis key Chorus uses (Celery's own keys get the same prefix)."""

from __future__ import annotations


def inbox(prefix: str, conversation_id: str) -> str:
    """Messages waiting for a conversation's current turn to end (a Stream)."""
    return f"{prefix}:inbox:{conversation_id}"


def cancelled(prefix: str, correlation_id: str) -> str:
    """Set while a job's tree is being cancelled: streaming model calls stop."""
    return f"{prefix}:cancel:{correlation_id}"


def rate_hold(prefix: str, conversation_id: str, turn_id: str, step: int, attempt: int) -> str:
    """When a step's model call (its ``attempt``) was first deferred by the
    agent's rate limits (:mod:`orchestrator.ratelimit`); gone once admitted."""
    return f"{prefix}:rate-hold:{conversation_id}:{turn_id}:{step}:{attempt}"


def events_stream(prefix: str, root_id: str) -> str:
    """The live event stream of one conversation tree."""
    return f"{prefix}:events:{root_id}"


def inboxes(prefix: str) -> str:
    """Ids of the conversations whose inbox may hold messages (a Set the
    sweeper reads to find messages whose dequeue was lost)."""
    return f"{prefix}:inboxes"


def inboxes_restored(prefix: str) -> str:
    """Present once this Redis's inboxes have been rebuilt from the queued
    messages recorded in Postgres; missing after Redis lost its data."""
    return f"{prefix}:inboxes:restored"


def readers(prefix: str, queue: str) -> str:
    """The workers reading a broker queue (a sorted set: node name scored by
    when its announcement expires, on Redis's clock)."""
    return f"{prefix}:readers:{queue}"


def dropped_messages(prefix: str) -> str:
    """How many broker messages workers dropped because they could not be
    decoded or delivered (an integer; ``chorus_broker_messages_dropped``)."""
    return f"{prefix}:broker:dropped"
