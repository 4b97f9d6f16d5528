"""Events are numbered without a lock per tree, and a follower resuming with
``since`` sees every event exactly once, in order, whatever commits when."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
from sqlmodel import select

from orchestrator import Client
from orchestrator.store.tables import Conversation, EventRow, Turn
from schemas import Event, EventName

pytestmark = pytest.mark.integration

CHILDREN = 40
ENDS = (EventName.TURN_COMPLETED, EventName.TURN_FAILED, EventName.TURN_CANCELLED)


def _stored(client: Client, correlation_id: str) -> list[int]:
    with client.runtime.session() as s:
        seqs = s.exec(select(EventRow.seq).where(EventRow.correlation_id == correlation_id)).all()
    return sorted(seqs)


def test_a_follower_resuming_at_random_points_of_a_fanout_sees_each_event_once(
    client: Client, workers: Any
) -> None:
    # Given a job whose children all write their events at the same time
    job = client.submit("spawner", f"spawn {CHILDREN}")
    rng = random.Random(9)

    # When a follower reads a few events at a time, leaving and resuming
    # with since=<the last seq it saw> while the tree runs
    seen: list[Event] = []
    while not (seen and seen[-1].turn_id == job.id and seen[-1].name in ENDS):
        since = seen[-1].seq if seen else None
        follower = job.events(since=since, deltas=False, timeout=120)
        for _, event in zip(range(rng.randint(1, 25)), follower, strict=False):
            seen.append(event)
        follower.close()
    assert job.result(timeout=10).startswith("children: ")

    # Then it saw every stored event of the job exactly once, in seq order
    seqs = [e.seq for e in seen]
    assert all(s is not None for s in seqs)
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # type: ignore[type-var]
    assert seqs == _stored(client, seen[0].correlation_id or "")
    names = [e.name for e in seen]
    assert names.count(EventName.SUBAGENT_COMPLETED) == CHILDREN
    assert names.count(EventName.TURN_COMPLETED) == CHILDREN + 1
    assert seen[-1].turn_id == job.id


def test_an_event_committed_after_a_later_numbered_one_is_not_skipped(
    client: Client, workers: Any
) -> None:
    # Given a finished job, and two more transactions writing events of its
    # tree: the first one opened (lower seq) commits after the second
    job = client.submit("echo-child", "task: numbering")
    job.result(timeout=60)
    with client.runtime.session() as s:
        conv = s.get(Conversation, job.conversation_id)
        turn = s.get(Turn, job.id)
    assert conv is not None and turn is not None
    last = _stored(client, turn.correlation_id)[-1]
    first_recorded = threading.Event()
    release = threading.Event()

    def slow_writer() -> None:
        with client.runtime.transaction() as (session, outbox):
            outbox.record(EventName.USAGE, conv, turn, 0, note="older")
            outbox.flush(session)  # stored and numbered now, committed later
            first_recorded.set()
            release.wait(30)

    slow = threading.Thread(target=slow_writer)
    slow.start()
    assert first_recorded.wait(30)
    with client.runtime.transaction() as (_, outbox):
        outbox.record(EventName.USAGE, conv, turn, 0, note="newer")

    # When a follower resumes after the job's last event while the older
    # transaction is still open (released a moment later)
    threading.Timer(1.0, release.set).start()
    resumed = list(job.events(since=last, deltas=False, timeout=30))
    slow.join(30)

    # Then it gets both, the older first: neither was skipped
    assert [e.data["note"] for e in resumed] == ["older", "newer"]
    assert [e.seq for e in resumed] == _stored(client, turn.correlation_id)[-2:]
