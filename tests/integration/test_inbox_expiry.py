"""An emptied inbox stream expires (issue 21, item 9: nothing a
conversation leaves in Redis stays forever)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator import Client
from orchestrator.engine.inbox import _enqueue, dequeue
from orchestrator.keys import inbox

pytestmark = pytest.mark.integration


def test_an_emptied_inbox_expires_and_a_queued_message_keeps_it(
    client: Client, workers: Any
) -> None:
    # Given a conversation that ran a sent message's turn
    job = client.submit("chatty", "hi")
    job.result(timeout=60)
    entry = client.send(job.conversation_id, "again")
    sent = None
    while sent is None:
        sent = client.job_for_message(job.conversation_id, entry)
    sent.result(timeout=60)
    settings = client.runtime.settings
    key = inbox(settings.redis_prefix, job.conversation_id)
    redis = client.runtime.redis

    # When its inbox is found empty (a dequeue, or the sweeper's look)
    assert dequeue(client.runtime, job.conversation_id) == []

    # Then the empty stream expires after the stream TTL, not never
    assert redis.exists(key) == 0 or 0 < redis.ttl(key) <= settings.event_stream_ttl
    # and a message queued there again (as send does, without its dequeue)
    # keeps it until it is dequeued
    _enqueue(client.runtime, job.conversation_id, {"text": "queued"})
    assert redis.ttl(key) == -1
    client.clear_queue(job.conversation_id)
