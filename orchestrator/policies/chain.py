"""Running an agent's policies around one model call (the engine's side of the seam).

``before_model`` hooks run in the order the agent lists them; ``after_model``
and ``on_model_failure`` hooks the other way round, like middleware. The
built-in :class:`~orchestrator.policies.retry.Retry` decides a failure no
listed policy decided. A hook that raises, or returns what the seam does
not allow, becomes a :class:`~orchestrator.errors.PolicyError` naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from orchestrator.errors import ChorusError, ModelError, PolicyError
from orchestrator.llm.reply import ModelReply
from orchestrator.logs import redact
from orchestrator.policies.registry import get_policy
from orchestrator.policies.retry import Retry
from orchestrator.policies.seam import Defer, ModelCall, Policy, Stop, ToolCall
from orchestrator.spec_checks import refuse_credentials, url_has_credentials
from schemas import AgentSpec

T = TypeVar("T")

#: The failure decision when no listed policy makes one.
RETRY = Retry()


def policies_of(spec: AgentSpec) -> tuple[Policy, ...]:
    """The agent's policies, in its order (:class:`UnknownPolicyError` for a
    name this worker lacks)."""
    return tuple(get_policy(name) for name in spec.policies)


def _guarded(policy: Policy, hook: str, run: Callable[..., T], *args: Any) -> T:
    try:
        return run(*args)
    except PolicyError:
        raise
    except Exception as exc:
        raise PolicyError(
            policy.name, f"raised in {hook}: {redact(f'{type(exc).__name__}: {exc}')}"
        ) from exc


def before_model(
    policies: Sequence[Policy], call: ModelCall
) -> tuple[str, ModelCall | Defer | Stop]:
    """Run every ``before_model`` hook in order; return the call to make
    (rewritten as they chose) or the first :class:`Defer` or :class:`Stop`,
    with the name of the policy that decided ("" for the call)."""
    for policy in policies:
        decided: Any = _guarded(policy, "before_model", policy.before_model, call)
        if isinstance(decided, Defer | Stop):
            _check_decision(policy, decided)
            return policy.name, decided
        if not isinstance(decided, ModelCall):
            raise PolicyError(
                policy.name,
                f"before_model returned {type(decided).__name__}: return the call "
                "(call.rewrite(...) to change it), Defer or Stop",
            )
        if decided is not call:
            _check_rewrite(policy, decided)
        call = decided
    return "", call


def after_model(policies: Sequence[Policy], call: ModelCall, reply: ModelReply) -> None:
    """Run every ``after_model`` hook, the last listed first."""
    for policy in reversed(policies):
        _guarded(policy, "after_model", policy.after_model, call, reply)


def on_model_failure(
    policies: Sequence[Policy], call: ModelCall, error: ModelError
) -> tuple[str, Defer | Stop]:
    """The decision on a failed call: the first ``on_model_failure`` hook
    (the last listed first) that makes one, else the built-in retry's."""
    for policy in (*reversed(policies), RETRY):
        decided: Any = _guarded(policy, "on_model_failure", policy.on_model_failure, call, error)
        if decided is None:
            continue
        if not isinstance(decided, Defer | Stop):
            raise PolicyError(
                policy.name,
                f"on_model_failure returned {type(decided).__name__}: return Defer, Stop or None",
            )
        _check_decision(policy, decided)
        return policy.name, decided
    raise AssertionError("the built-in retry always decides")  # pragma: no cover


def before_tool(policies: Sequence[Policy], call: ToolCall) -> tuple[str, ToolCall | Defer | Stop]:
    """Run every ``before_tool`` hook in order: the call to run (its params
    as they rewrote them) or the first :class:`Defer` or :class:`Stop`,
    with its policy's name."""
    for policy in policies:
        decided: Any = _guarded(policy, "before_tool", policy.before_tool, call)
        if isinstance(decided, Defer | Stop):
            _check_decision(policy, decided)
            return policy.name, decided
        if not (isinstance(decided, ToolCall) and isinstance(decided.params, dict)):
            raise PolicyError(
                policy.name,
                f"before_tool returned {type(decided).__name__}: return the call "
                "(call.rewrite(params=...) to change it), Defer or Stop",
            )
        call = decided
    return "", call


def after_tool(policies: Sequence[Policy], call: ToolCall, result: Any, is_error: bool) -> None:
    """Run every ``after_tool`` hook, the last listed first."""
    for policy in reversed(policies):
        _guarded(policy, "after_tool", policy.after_tool, call, result, is_error)


#: The longest a policy may defer a call: a day (a longer wait is a stop,
#: not a deferral; a turn deferred for years would hold its conversation).
MAX_DEFER_SECONDS = 86_400.0


def _check_decision(policy: Policy, decided: Defer | Stop) -> None:
    if isinstance(decided, Defer) and not (
        isinstance(decided.seconds, int | float)
        and not isinstance(decided.seconds, bool)
        and 0 <= decided.seconds <= MAX_DEFER_SECONDS
    ):
        raise PolicyError(
            policy.name,
            f"deferred by {decided.seconds!r} seconds: a deferral is 0 to "
            f"{MAX_DEFER_SECONDS:,.0f} seconds",
        )


def _check_rewrite(policy: Policy, call: ModelCall) -> None:
    """A rewrite may name any model and settings (a policy is the workers'
    own code, trusted like a registered agent, so the inline-spec endpoint
    allow-list does not apply), but never a credential: keys stay in the
    workers' environment, out of every event and row."""
    if not isinstance(call.model, str) or not call.model.strip():
        raise PolicyError(policy.name, "rewrote the call to an empty model")
    if _holds_credentials(call.model):
        raise PolicyError(policy.name, "rewrote the call to a model string holding credentials")
    if not isinstance(call.messages, list) or not isinstance(call.settings, dict):
        raise PolicyError(policy.name, "rewrote messages or settings to the wrong type")
    try:
        refuse_credentials(call.settings)
    except ChorusError as exc:
        raise PolicyError(policy.name, f"rewrote the settings: {exc}") from None


def _holds_credentials(model: str) -> bool:
    """A URL with credentials, a query naming one even without a scheme
    (``openai/gpt-4o?api_key=...``), or anything :func:`redact` would mask
    (a key-shaped name): the model string goes into events as it is."""
    probe = model if "://" in model else f"model://{model}"
    return url_has_credentials(probe) or redact(model) != model
