"""The agent's rate limits as a built-in policy (the windows: :mod:`orchestrator.ratelimit`)."""

from __future__ import annotations

import redis

from orchestrator import keys
from orchestrator.llm.reply import ModelReply
from orchestrator.policies.seam import Defer, ModelCall, Policy
from orchestrator.ratelimit import admit, record_output


class RateLimits(Policy):
    """The agent's ``rate_limits``, shared by every worker through Redis.

    ``before_model`` admits the request (``tokens``, its size) in each
    window, keyed by the call's model (the one the agent's policies chose)
    or the limit's key, or defers the call until the windows have room;
    ``after_model`` counts the reply's output tokens. The engine runs it
    last, after the agent's policies and context fitting, on the call they
    produced; one instance a call (it carries the request's size, and the
    time it was admitted and how long it was held first, for
    ``llm.requested``).
    """

    name = "rate-limits"

    def __init__(self, client: redis.Redis, prefix: str, allowance: float, tokens: int = 0):
        self.client = client
        self.prefix = prefix
        self.allowance = allowance
        self.tokens = tokens
        #: Redis's time when the call was admitted.
        self.admitted_at: float | None = None
        #: Seconds the limits held the call (deferred it) before admitting it.
        self.held = 0.0

    def before_model(self, call: ModelCall) -> ModelCall | Defer:
        limits = call.agent.rate_limits
        mark = None  # a checkpoint's call records no llm.requested: no mark
        if limits and not call.checkpoint:
            ids = (call.conversation_id, call.turn_id, call.step, call.attempt)
            mark = keys.rate_hold(self.prefix, *ids)
        admission = admit(
            self.client,
            self.prefix,
            limits,
            call.model,
            call.context_data,
            self.tokens,
            self.allowance,
            mark,
        )
        if admission.wait > 0:
            return Defer(admission.wait, "rate limit")
        self.admitted_at = admission.now
        self.held = admission.held
        return call

    def after_model(self, call: ModelCall, reply: ModelReply) -> None:
        record_output(
            self.client,
            self.prefix,
            call.agent.rate_limits,
            call.model,
            call.context_data,
            reply.usage.output_tokens,
            self.allowance,
        )
