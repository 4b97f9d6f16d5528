"""The agent's ``max_steps`` as a built-in policy."""

from __future__ import annotations

from orchestrator.policies.seam import ModelCall, Policy, Stop


class MaxSteps(Policy):
    """Stop a turn that made ``max_steps`` model calls without an answer:
    the call that would be one more is not made and the turn fails."""

    name = "max-steps"

    def before_model(self, call: ModelCall) -> ModelCall | Stop:
        limit = call.agent.max_steps
        if call.step >= limit:
            return Stop(f"no final answer within max_steps={limit}")
        return call
