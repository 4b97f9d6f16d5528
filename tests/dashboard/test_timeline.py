"""What a job page draws, from events: lanes, segments, barriers, stragglers,
waits (retry backoff, a provider's 429, the agent's rate limits, a person's
approval) and the model call's first token."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from orchestrator.server.dashboard.routes import templates
from orchestrator.server.dashboard.timeline import Step, build

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
    assert [round(q.seconds, 3) for q in alone.queues] == [0.2]
    assert alone.approval is None
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


def _drawn(step: Step) -> str:
    return templates.env.get_template("_step.html").render(s=step)


def test_the_first_token_is_marked_on_the_model_call() -> None:
    # Given a streamed call of 2 s whose first token came after 0.5 s, and
    # a call of the next step that streamed nothing
    events = [
        _event("llm.requested", 0.0, model="m"),
        _event("llm.completed", 2.0, seconds=2.0, first_token_seconds=0.5),
        {**_event("llm.requested", 3.0, model="m"), "step": 1},
        {**_event("llm.completed", 4.0, seconds=1.0, first_token_seconds=None), "step": 1},
    ]

    streamed, unstreamed = build(events).of("c")

    # Then the first is marked a quarter along its bar, with its label
    assert streamed.first_token == 0.5
    assert streamed.first_token_at == streamed.begins + 0.5
    assert streamed.pct(streamed.first_token_at) == 25.0
    html = _drawn(streamed)
    assert 'class="tick ttft" style="left:25.0%" title="first token after 500 ms"' in html
    assert "first token 500 ms" in html
    # and the other has no mark
    assert unstreamed.first_token_at is None and "ttft" not in _drawn(unstreamed)


def _asked(rid: str, answer: str, at: float) -> list[dict[str, Any]]:
    common = {"tool": "book_flight", "tool_request_id": rid}
    rows = [
        _event("tool.requested", 1.0, **common, segment=0, parallelizable=True),
        _event("tool.approval_requested", 1.1, **common, call_id=f"call-{rid}"),
        _event(f"tool.{answer}", at, **common, call_id=f"call-{rid}", by="ann"),
    ]
    if answer == "approved":
        rows += [
            _event("tool.started", at + 0.2, **common),
            _event("tool.completed", 9.5, **common),
        ]
    else:
        rows.append(_event("tool.failed", at, **common, result="denied: no"))
    return rows


def test_a_wait_for_a_person_is_drawn_apart_from_queue_and_run_time() -> None:
    # Given a call approved after 3.9 s, then run, and one denied after 2.9 s
    events = [_event("llm.requested", 0.0, model="m"), _event("llm.completed", 1.0, seconds=1.0)]
    events += sorted(
        _asked("a", "approved", 5.0) + _asked("d", "denied", 4.0), key=lambda e: e["time"]
    )

    step = build(events).of("c")[0]

    approved, denied = step.lanes["a"], step.lanes["d"]
    # Then the approved call's wait for a person stands between its two
    # waits for a worker (claimed, then run once approved) and its run
    assert approved.approval is not None and round(approved.approval.seconds, 3) == 3.9
    assert [round(q.seconds, 3) for q in approved.queues] == [0.1, 0.2]
    assert approved.run is not None and round(approved.run.seconds, 3) == 4.3
    assert (approved.answer, approved.answered_by) == ("approved", "ann")
    assert approved.status == "completed"
    # and the denied one waited for a person, then failed without running
    assert denied.approval is not None and round(denied.approval.seconds, 3) == 2.9
    assert [round(q.seconds, 3) for q in denied.queues] == [0.1]
    assert (denied.answer, denied.status) == ("denied", "failed")
    html = _drawn(step)
    assert html.count('class="bar wait approval" data-reason="approval"') == 2
    assert "approval: waited 3.9 s for a person (approved by ann)" in html
    assert "approval 2.9 s (denied)" in html


def test_a_call_still_waiting_for_a_person_shows_its_wait_begun() -> None:
    common = {"tool": "book_flight", "tool_request_id": "w"}
    events = [
        _event("tool.requested", 1.0, **common, segment=0),
        _event("tool.approval_requested", 1.5, **common, call_id="call-w"),
    ]

    lane = build(events).of("c")[0].lanes["w"]

    assert lane.status == "awaiting" and lane.answer == ""
    assert lane.approval is not None and lane.approval.start == lane.asked
    assert "(no answer yet)" in _drawn(build(events).of("c")[0])


def test_a_call_held_by_the_agents_rate_limits_waits_before_it_is_sent() -> None:
    # Given a call the agent's own rate limits deferred 4 s (no provider
    # answered 429: llm.requested says how long it was held)
    events = [
        _event("llm.requested", 5.0, model="m", rate_limited_seconds=4.0),
        _event("llm.completed", 6.0, seconds=1.0),
    ]

    step = build(events).of("c")[0]

    # Then the step begins when the hold did, with a rate-limit wait up to the call
    (wait,) = step.waits
    assert (wait.reason, wait.span.seconds) == ("rate limit", 4.0)
    assert step.model is not None and wait.span.end == step.model.start
    assert step.begins == wait.span.start and step.seconds == 5.0
    assert "agent's rate limits" in wait.detail
    assert 'data-reason="rate limit"' in _drawn(step)
