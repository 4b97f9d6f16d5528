"""The built-in retry: backoff with jitter on retryable model errors."""

from __future__ import annotations

import random

from orchestrator.errors import ModelError
from orchestrator.policies.seam import Defer, ModelCall, Policy, Stop
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


class Retry(Policy):
    """The last word on a failed model call when no listed policy decided:
    a retryable error (rate limit, timeout, connection, 5xx) is tried again
    after :func:`retry_delay` of the agent's ``retry`` and the attempt
    number; any other error, or one past ``max_attempts``, fails the turn."""

    name = "retry"

    def on_model_failure(self, call: ModelCall, error: ModelError) -> Defer | Stop:
        delay = retry_delay(call.agent.retry, call.attempt) if error.retryable else None
        if delay is None:
            return Stop(f"model call failed after {call.attempt} attempt(s): {error}")
        return Defer(delay, "retry")
