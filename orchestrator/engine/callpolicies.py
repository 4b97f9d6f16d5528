"""The engine's side of the policy seam (:mod:`orchestrator.policies`): the
:class:`~orchestrator.policies.ModelCall` a step's policies see, built from
what the step read as it took its lease, the durable record of a failed
call that the next attempt's policies see, and the
:class:`~orchestrator.policies.ToolCall` a tool run's policies see.

The retry count is the conversation's ``step_failures`` column (reset by
every cursor move); each failure is also logged in ``step_failure_log``
with the position it happened at, so a policy can decide by the step's
earlier failures (which model, which status) in whatever process runs the
next attempt. Only entries of the current position are shown.

Every agent's calls go through the built-in policies as well as its own
(:func:`step_policies`, :func:`tool_policies`); a built-in's stop is the
turn's error (or a refused tool's result) as it says it, without the
``policy '<name>' stopped ...`` a listed policy's gets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from orchestrator.engine.access import ToolAccess
from orchestrator.engine.budget import Budgets
from orchestrator.engine.context_fit import ContextFit
from orchestrator.errors import ModelError, PolicyError
from orchestrator.logs import redact
from orchestrator.policies import Defer, Failure, ModelCall, Policy, Stop, ToolCall
from orchestrator.policies.chain import before_model, policies_of
from orchestrator.policies.max_steps import MaxSteps
from orchestrator.policies.ratelimits import RateLimits
from orchestrator.policies.registry import BUILTIN_NAMES
from orchestrator.ratelimit import RateLimited
from orchestrator.runtime import Runtime
from orchestrator.store.rows import CallRow
from schemas import AgentSpec

#: The most failures :func:`failure_log` keeps (the latest).
MAX_LOGGED_FAILURES = 20
#: Characters of a failure's error kept in the log.
_ERROR_CHARS = 500


class _Failures(Protocol):
    """What :func:`model_call` reads of the conversation (a leased row or an entity)."""

    @property
    def id(self) -> str: ...
    @property
    def step_failures(self) -> int: ...
    @property
    def step_failure_log(self) -> list[dict[str, Any]] | None: ...


_MAX_STEPS = MaxSteps()
_TOOL_ACCESS = ToolAccess()


def step_policies(
    policies: Sequence[Policy], budgets: Budgets, fit: ContextFit
) -> tuple[Policy, ...]:
    """The ``before_model`` chain of a step's call: the turn's ``max_steps``,
    the job's budget (``budgets``: one a step), the agent's own
    ``policies`` (:func:`~orchestrator.policies.chain.policies_of`), then
    context fitting (``fit``: one a request). The rate limits admit the
    call they produce, last (:func:`rate_limits`)."""
    return (_MAX_STEPS, budgets, *policies, fit)


def tool_policies(spec: AgentSpec) -> tuple[Policy, ...]:
    """What a tool or subagent call goes through: tool access first, then
    the agent's own policies."""
    return (_TOOL_ACCESS, *policies_of(spec))


def _at(log: list[dict[str, Any]] | None, turn_id: str, step: int) -> list[dict[str, Any]]:
    return [e for e in log or () if e.get("turn") == turn_id and e.get("step") == step]


def model_call(
    spec: AgentSpec,
    conv: _Failures,
    turn: tuple[str, dict[str, Any]],
    step: int,
    request: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> ModelCall:
    """The call a step is about to make, before its policies: the agent's
    model and settings, ``request`` (messages and tools), the attempt
    number from the retry count. ``turn``: its id and ``context_data``."""
    turn_id, context_data = turn
    messages, tools = request
    return ModelCall(
        agent=spec,
        conversation_id=conv.id,
        turn_id=turn_id,
        step=step,
        context_data=context_data,
        attempt=conv.step_failures + 1,
        failures=tuple(Failure.from_json(e) for e in _at(conv.step_failure_log, turn_id, step)),
        model=spec.model,
        messages=messages,
        tools=tools,
        settings=spec.model_settings,
    )


def failure_log(conv: _Failures, call: ModelCall, error: ModelError) -> list[dict[str, Any]]:
    """The conversation's failure log with ``call``'s failure added (entries
    of other positions dropped, the latest :data:`MAX_LOGGED_FAILURES` kept)."""
    failure = Failure(call.model, error.status, error.retryable, redact(str(error))[:_ERROR_CHARS])
    entry = {"turn": call.turn_id, "step": call.step, **failure.to_json()}
    return [*_at(conv.step_failure_log, call.turn_id, call.step), entry][-MAX_LOGGED_FAILURES:]


def stop_error(policy: str, stop: Stop) -> str:
    """The turn's error when ``policy`` stopped a model call."""
    if policy in BUILTIN_NAMES:
        return redact(stop.reason)
    return redact(f"policy {policy!r} stopped the model call: {stop.reason}")


def tool_call(
    spec: AgentSpec, call: CallRow, turn: tuple[str, dict[str, Any]], conversation_id: str
) -> ToolCall:
    """The tool call a run's policies see. ``turn``: its id and ``context_data``."""
    turn_id, context_data = turn
    return ToolCall(
        agent=spec,
        conversation_id=conversation_id,
        turn_id=turn_id,
        step=call.step,
        context_data=context_data,
        tool=call.tool,
        params=call.params,
        call_id=call.id,
        attempt=call.attempts,
    )


def tool_refusal(policy: str, stop: Stop) -> str:
    """The error result of a tool call ``policy`` refused."""
    if policy in BUILTIN_NAMES:
        return redact(stop.reason)
    return redact(f"Error: tool call refused by policy {policy!r}: {stop.reason}")


def checkpoint_call(
    spec: AgentSpec,
    conversation_id: str,
    turn: tuple[str, dict[str, Any]],
    step: int,
    prompt: list[dict[str, Any]],
) -> ModelCall:
    """A checkpoint's summarizer call through the agent's policies (they
    see ``checkpoint=True``): the call to make. A deferral raises
    :class:`~orchestrator.ratelimit.RateLimited` (the checkpoint is tried
    again then, like one over a rate limit), a stop
    :class:`~orchestrator.errors.PolicyError`."""
    turn_id, context_data = turn
    call = ModelCall(
        agent=spec,
        conversation_id=conversation_id,
        turn_id=turn_id,
        step=step,
        context_data=context_data,
        attempt=1,
        failures=(),
        model=spec.model,
        messages=prompt,
        settings=spec.model_settings,
        checkpoint=True,
    )
    policy, decided = before_model(policies_of(spec), call)
    if isinstance(decided, Defer):
        raise RateLimited(decided.seconds)
    if isinstance(decided, Stop):
        raise PolicyError(policy, f"stopped the checkpoint's model call: {decided.reason}")
    return decided


def rate_limits(rt: Runtime, tokens: int = 0) -> RateLimits:
    """The built-in rate-limit policy for one call of ``tokens``."""
    return RateLimits(rt.redis, rt.settings.redis_prefix, rt.settings.rate_limit_allowance, tokens)
