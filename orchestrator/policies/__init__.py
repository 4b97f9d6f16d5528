"""Policies: hooks around each model call, built in and the users' own.

A policy may admit a model call as it is, rewrite it (model, messages,
settings), defer it (the step is sent again with a countdown, never a
sleep), stop it (the turn fails with the reason) or observe its reply or
failure; around each tool run it may rewrite the arguments, refuse the
call (the model gets an error result) or observe the result. Register
one by name in a module the workers import and list it on an agent::

    from orchestrator.policies import ModelCall, Policy, policy

    @policy("redact-emails")
    def redact_emails(call: ModelCall) -> ModelCall:
        return call.rewrite(messages=[...])

    Agent("support", model="openai/gpt-4o-mini", policies=["redact-emails"])

Built in: the retry with backoff and jitter (:class:`Retry`, the agent's
``retry``), which decides a failure no listed policy decided. See
docs/architecture.md (Policies) for the order hooks run in.
"""

from orchestrator.policies.registry import (
    FunctionPolicy,
    check_policies,
    get_policy,
    policy,
    policy_names,
    register_policy,
)
from orchestrator.policies.retry import Retry, retry_delay
from orchestrator.policies.seam import Defer, Failure, ModelCall, Policy, Stop, ToolCall

__all__ = [
    "Defer",
    "Failure",
    "FunctionPolicy",
    "ModelCall",
    "Policy",
    "Retry",
    "Stop",
    "ToolCall",
    "check_policies",
    "get_policy",
    "policy",
    "policy_names",
    "register_policy",
    "retry_delay",
]
