"""What a job page draws, from events: lanes, segments, barriers, stragglers, waits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from orchestrator.server.dashboard.timeline import build

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _event(name: str, at: float, **data: Any) -> dict[str, Any]:
    return {
        "name": name,
        "conversation_id": "c",
        "step": 0,
        "time": (T0 + timedelta(seconds=at)).isoformat(),
        "data": data,
    }


def _call(rid: str, segment: int, parallel: bool, start: float, end: float) -> list[Any]:
    common = {"tool": "timed", "tool_request_id": rid}
    return [
        (1.0, "tool.requested", {**common, "segment": segment, "parallelizable": parallel}),
        (start, "tool.started", common),
        (end, "tool.completed", common),
    ]


def test_a_batch_is_drawn_as_segments_of_lanes_with_barriers_and_a_straggler() -> None:
    # Given a model call, three parallel calls (p3 the slowest), then one that runs alone
    rows = [
        (0.0, "llm.requested", {"model": "m"}),
        (1.0, "llm.completed", {"seconds": 1.0}),
        *_call("p1", 0, True, 1.2, 1.5),
        *_call("p2", 0, True, 1.3, 1.6),
        *_call("p3", 0, True, 1.2, 2.5),
        *_call("b", 1, False, 2.7, 3.0),
    ]
    events = [_event(name, at, **data) for at, name, data in sorted(rows, key=lambda r: r[0])]

    step = build(events).of("c")[0]

    first, second = step.segments
    assert [lane.request_id for lane in first.lanes] == ["p1", "p2", "p3"]
    assert first.straggler is not None and first.straggler.request_id == "p3"
    assert first.ends == step.begins + 2.5 and not first.barrier
    assert second.barrier and second.straggler is None
    # the call after the barrier queued from the barrier on, not from the reply
    (alone,) = second.lanes
    assert alone.queue is not None and round(alone.queue.seconds, 3) == 0.2
    assert step.model is not None and step.model.seconds == 1.0
    assert step.pct(step.begins + 1.5) == 50.0


def test_a_failed_model_call_is_a_failure_and_its_retry_a_wait_with_its_reason() -> None:
    events = [
        _event("llm.requested", 0.0, model="m"),
        _event("llm.failed", 0.5, error="busy", status=429, body="slow down", retry_in=2.0),
        _event("llm.failed", 3.0, error="boom", status=500, body="", retry_in=1.0),
    ]

    step = build(events).of("c")[0]

    assert [(w.reason, w.span.seconds) for w in step.waits] == [
        ("rate limit", 2.0),
        ("retry backoff", 1.0),
    ]
    assert [(f["status"], f["body"]) for f in step.failures] == [(429, "slow down"), (500, "")]
