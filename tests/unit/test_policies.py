"""Retry backoff."""

from __future__ import annotations

import random

from orchestrator.policies import retry_delay
from schemas.specs import RetryPolicy


def test_delays_grow_exponentially_up_to_the_cap_then_stop() -> None:
    policy = RetryPolicy(max_attempts=6, initial_delay=1, factor=3, max_delay=20, jitter=0)
    assert [retry_delay(policy, n) for n in range(1, 7)] == [1, 3, 9, 20, 20, None]


def test_jitter_spreads_delays_within_its_fraction() -> None:
    policy = RetryPolicy(initial_delay=10, jitter=0.2)
    rng = random.Random(7)
    delays = [retry_delay(policy, 1, rng) for _ in range(200)]
    assert all(d is not None and 8 <= d <= 12 for d in delays)
    assert len({round(d or 0, 6) for d in delays}) > 100
