"""Policies around model calls: retry backoff (more come as hooks here)."""

from __future__ import annotations

import random

from schemas.specs import RetryPolicy


def retry_delay(
    policy: RetryPolicy, failures: int, rng: random.Random | None = None
) -> float | None:
    """Seconds before the next attempt after ``failures`` failed ones, or None
    when the policy allows no more: ``initial * factor**(failures-1)``,
    capped at ``max_delay``, spread by ± ``jitter``."""
    if failures >= policy.max_attempts:
        return None
    base = min(policy.max_delay, policy.initial_delay * policy.factor ** (failures - 1))
    spread = base * policy.jitter
    return max(0.0, base + (rng or random).uniform(-spread, spread))
