"""Sending to a conversation that never ran a turn (issue 8, item 8, the send half)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlmodel import select

from orchestrator import Client, ConversationNotFound, Job
from orchestrator.keys import inbox
from orchestrator.store.tables import EventRow
from schemas import EventName

pytestmark = pytest.mark.integration


def _job_for(client: Client, conversation_id: str, entry: str, timeout: float = 60) -> Job:
    deadline = time.monotonic() + timeout
    while (job := client.job_for_message(conversation_id, entry)) is None:
        assert time.monotonic() < deadline, f"message {entry} never started a turn"
        time.sleep(0.1)
    return job


def test_a_message_sent_to_a_fresh_fork_runs_as_a_turn(client: Client, workers: Any) -> None:
    # Given a fork of a finished conversation: it has history but never ran a turn
    original = client.submit("quick", "first")
    original.result(timeout=30)
    fork = client.fork(original.conversation_id)

    # When a message is sent to the fork
    entry = client.send(fork, "to the fork")

    # Then it is recorded and runs as the fork's first turn, on the copied history
    assert _job_for(client, fork, entry).result(timeout=30) == "ok: to the fork"
    assert [m.text for m in client.history(fork)] == [
        "first",
        "ok: first",
        "to the fork",
        "ok: to the fork",
    ]
    with client.runtime.session() as s:
        queued = s.exec(
            select(EventRow).where(
                EventRow.root_id == fork, EventRow.name == EventName.MESSAGE_QUEUED.value
            )
        ).all()
    assert [(e.data["entry"], e.data["text"]) for e in queued] == [(entry, "to the fork")]
    assert client.clear_queue(fork) == 0


def test_a_refused_send_leaves_no_message_behind(client: Client) -> None:
    rt = client.runtime
    with pytest.raises(ConversationNotFound):
        client.send("no-such-conversation", "hello")
    assert rt.redis.xlen(inbox(rt.settings.redis_prefix, "no-such-conversation")) == 0
