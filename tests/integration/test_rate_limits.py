"""A rate limit shared by two worker processes through Redis."""

from __future__ import annotations

import bisect
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator import Client, Settings, keys
from orchestrator.ratelimit import admit, record_output
from schemas import EventName, RateLimit
from tests.agents import RATE
from tests.conftest import WorkerProcess

pytestmark = pytest.mark.integration


@pytest.fixture()
def second_llm_worker(settings: Settings, client: Client, workers: Any) -> Iterator[WorkerProcess]:
    extra = WorkerProcess(
        settings, "llm2", "-Q", "llm,control", "-P", "threads", "-c", "16", "--without-mingle"
    )
    try:
        extra.wait_ready(client)
        yield extra
    finally:
        extra.stop()


@pytest.mark.long
def test_two_workers_stay_within_a_requests_per_second_limit(
    client: Client, second_llm_worker: WorkerProcess
) -> None:
    # Given 30 one-step jobs of one tenant limited to RATE model calls a second
    tenant = uuid.uuid4().hex[:8]
    jobs = [client.submit("limited", f"q{i}", context_data={"tenant": tenant}) for i in range(30)]

    # When both llm workers run them
    for job in jobs:
        assert job.result(timeout=60).startswith("ok q")

    # Then no window of one second admitted more than RATE calls, across both
    requested = [
        e
        for job in jobs
        for e in job.events(deltas=False, timeout=5)
        if e.name is EventName.LLM_REQUESTED
    ]
    admitted = sorted(e.data["admitted_at"] for e in requested)
    assert len(admitted) == 30
    busiest = max(bisect.bisect_left(admitted, t + 1.0) - i for i, t in enumerate(admitted))
    assert busiest <= RATE
    # the calls were spread out by the limit, not dropped, and both workers took part
    assert admitted[-1] - admitted[0] >= (30 / RATE) - 1 - 0.05
    assert len({e.data["worker"] for e in requested}) == 2
    # and each call the limit deferred says how long it was held, from no
    # earlier than the burst began (calls admitted at once say nothing)
    held = [e.data["rate_limited_seconds"] for e in requested if "rate_limited_seconds" in e.data]
    assert len(held) >= 30 - 3 * RATE
    assert all(0 < h <= admitted[-1] - admitted[0] + 1.0 for h in held)


def test_token_window_defers_until_tokens_leave_it(client: Client) -> None:
    rt = client.runtime
    prefix = f"{rt.settings.redis_prefix}:t{uuid.uuid4().hex[:6]}"
    limits = [RateLimit(tokens=100, period=0.5)]
    assert admit(rt.redis, prefix, limits, "m", {}, 60)[0] == 0
    assert admit(rt.redis, prefix, limits, "m", {}, 30)[0] == 0
    wait = admit(rt.redis, prefix, limits, "m", {}, 20).wait  # 110 > 100: deferred
    assert 0 < wait <= 0.5
    time.sleep(wait + 0.01)
    assert admit(rt.redis, prefix, limits, "m", {}, 20)[0] == 0
    # a single call larger than the limit still goes through when the window is empty
    time.sleep(0.6)
    assert admit(rt.redis, prefix, limits, "m", {}, 500)[0] == 0


def test_an_admission_says_how_long_its_call_was_held(client: Client) -> None:
    # Given a window of one call a second, full, and a call's hold mark
    rt = client.runtime
    prefix = f"{rt.settings.redis_prefix}:h{uuid.uuid4().hex[:6]}"
    limits = [RateLimit(requests=1, period=1.0)]
    mark = keys.rate_hold(prefix, "conv", "turn", 3, 1)
    assert admit(rt.redis, prefix, limits, "m", {}, 1).held == 0.0

    # When the call is deferred twice, then admitted
    first = admit(rt.redis, prefix, limits, "m", {}, 1, mark=mark)
    time.sleep(first.wait / 2)
    second = admit(rt.redis, prefix, limits, "m", {}, 1, mark=mark)
    assert first.wait > 0 and second.wait > 0
    time.sleep(second.wait + 0.01)
    admitted = admit(rt.redis, prefix, limits, "m", {}, 1, mark=mark)

    # Then it was held since its first deferral, and its mark is gone
    assert admitted.wait == 0
    assert admitted.held == pytest.approx(admitted.now - first.now, abs=1e-3)
    assert admitted.held >= first.wait - 0.01
    assert not rt.redis.exists(mark)
    time.sleep(1.0)
    assert admit(rt.redis, prefix, limits, "m", {}, 1, mark=mark).held == 0.0


def test_output_tokens_are_counted_after_the_call(client: Client) -> None:
    rt = client.runtime
    prefix = f"{rt.settings.redis_prefix}:o{uuid.uuid4().hex[:6]}"
    limits = [RateLimit(tokens=100, period=0.5, count="output")]
    assert admit(rt.redis, prefix, limits, "m", {}, 5000)[0] == 0  # input is not counted
    record_output(rt.redis, prefix, limits, "m", {}, 80)
    assert admit(rt.redis, prefix, limits, "m", {}, 5000)[0] == 0  # 80 of 100 used
    record_output(rt.redis, prefix, limits, "m", {}, 30)
    assert admit(rt.redis, prefix, limits, "m", {}, 1)[0] > 0  # 110: deferred
