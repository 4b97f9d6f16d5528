"""The loop end to end through separate `chorus worker` processes: live streams and
parallel calls (its decisions are tested on the harness: tests/engine/test_loop.py)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator import Client
from schemas import EventName
from tests.conftest import tool_calls

pytestmark = pytest.mark.integration


def test_live_events_stream_deltas_and_end_with_the_turn(client: Client, workers: Any) -> None:
    job = client.submit("trip-planner", "Lisbon again")
    seen = list(job.events(timeout=60))
    names = [e.name for e in seen]
    assert EventName.ASSISTANT_DELTA in names
    assert names[-1] is EventName.TURN_COMPLETED
    stored = [e.seq for e in seen if e.seq is not None]
    assert stored == sorted(stored) and len(stored) == len(set(stored))
    # resuming from a sequence number replays only what came after it
    resumed = list(job.events(since=stored[5], deltas=False, timeout=10))
    assert [e.seq for e in resumed] == stored[6:]


def test_parallel_calls_overlap_and_barrier_runs_alone(client: Client, workers: Any) -> None:
    job = client.submit("ordering", "go")
    job.result(timeout=60)
    calls = tool_calls(client, job.id)
    span = {c.result["label"]: (c.result["start"], c.result["end"]) for c in calls}
    first = [span[k] for k in ("p1", "p2", "p3")]
    after = [span[k] for k in ("q1", "q2")]
    barrier = span["b"]
    # parallel calls overlap in time
    assert max(s for s, _ in first) < min(e for _, e in first)
    assert max(s for s, _ in after) < min(e for _, e in after)
    # the barrier starts after every earlier call ended, later calls after it ended
    assert barrier[0] >= max(e for _, e in first)
    assert min(s for s, _ in after) >= barrier[1]
    assert [c.segment for c in calls] == [0, 0, 0, 1, 2, 2]
