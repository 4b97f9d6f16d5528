"""Live event streams expire and their entries are bounded (issue 21, item 9):
a tree's Redis Stream goes CHORUS_EVENT_STREAM_TTL seconds after its last
event, a follower of an expired stream still gets every event (Postgres),
and no entry carries more than ENTRY_CHARS of event."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest
from sqlmodel import col, select

from orchestrator import Client, Job, Settings
from orchestrator.events import ENTRY_CHARS, ENTRY_EVENT, ENTRY_NAME
from orchestrator.keys import events_stream
from orchestrator.store.tables import EventRow
from tests.conftest import WorkerProcess

pytestmark = pytest.mark.integration

TTL = 4


@pytest.fixture(scope="module")
def short_lived(settings: Settings) -> Iterator[Client]:
    """A client and a worker for every queue whose streams expire after TTL seconds."""
    mine = settings.model_copy(
        update={"redis_prefix": f"{settings.redis_prefix}-ttl-{uuid.uuid4().hex[:6]}"}
    )
    mine = mine.model_copy(update={"event_stream_ttl": TTL})
    client = Client(mine)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CHORUS_EVENT_STREAM_TTL", str(TTL))
        worker = WorkerProcess(mine, "ttl", "-Q", "llm,control,tools", "-P", "threads", "-c", "4")
    try:
        worker.wait_ready(client)
        yield client
    finally:
        worker.stop()
        client.close()


def _stream(client: Client, job: Job) -> str:
    return events_stream(client.runtime.settings.redis_prefix, job.root_id)


def _stored_seqs(client: Client, job: Job) -> list[int]:
    with client.runtime.session() as s:
        rows = s.exec(
            select(EventRow.seq)
            .where(EventRow.root_id == job.root_id, EventRow.turn_id == job.id)
            .order_by(col(EventRow.seq))
        ).all()
    return list(rows)


def test_a_trees_stream_expires_and_its_followers_still_get_every_event(
    short_lived: Client,
) -> None:
    client = short_lived
    redis = client.runtime.redis
    first = client.submit("quick", "hello")
    assert first.result(timeout=60) == "ok: hello"
    stream = _stream(client, first)

    # The stream is set to expire TTL seconds after its last event ...
    assert 0 < redis.ttl(stream) <= TTL
    deadline = time.monotonic() + TTL + 10
    while redis.exists(stream):
        assert time.monotonic() < deadline, f"{stream} did not expire (ttl {redis.ttl(stream)})"
        time.sleep(0.2)

    # ... and a follower of the expired stream still gets every event, from Postgres
    replayed = [e.seq for e in first.events(timeout=30, deltas=False)]
    assert replayed == _stored_seqs(client, first) and len(replayed) >= 4

    # A follower of a new turn on that tree, subscribed to the expired stream,
    # sees it live to its end; the stream it recreates expires again.
    second = client.submit("quick", "again", conversation_id=first.conversation_id)
    followed = list(second.events(timeout=30, deltas=False))
    assert followed[-1].name.value == "turn.completed"
    assert [e.seq for e in followed] == _stored_seqs(client, second)
    assert 0 < redis.ttl(stream) <= TTL


def test_no_stream_entry_carries_more_than_the_bound(short_lived: Client) -> None:
    client = short_lived
    big = "x" * 60_000  # one word: the model streams it as one piece
    job = client.submit("quick", big)

    # result() still gets the whole answer (its end event is too large for an entry)
    assert job.result(timeout=60) == f"ok: {big}"

    entries = client.runtime.redis.xrange(_stream(client, job))
    assert entries, "the stream expired before it was read"
    sizes = {fields[ENTRY_NAME]: len(fields[ENTRY_EVENT]) for _, fields in entries}
    assert max(sizes.values()) <= ENTRY_CHARS, sizes
    assert {"cut:turn.started", "cut:turn.completed"} <= set(sizes)
    # the streamed text is all there, in bounded pieces
    deltas = [
        json.loads(fields[ENTRY_EVENT])["data"]["text"]
        for _, fields in entries
        if fields[ENTRY_NAME] == "assistant.delta"
    ]
    assert "".join(deltas) == f"ok: {big}" and len(deltas) > 2
