"""Policies registered by name: what an agent's ``policies`` may list.

Like tools, policies are declared in modules the workers import
(``CHORUS_MODULES``); a job's spec only names them, so nothing in a payload
is ever imported or evaluated.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import TypeVar, overload

from orchestrator.errors import ConfigurationError, UnknownPolicyError
from orchestrator.policies.seam import Defer, ModelCall, Policy, Stop
from schemas.specs import NAME_PATTERN

_policies: dict[str, Policy] = {}

#: The built-in policies' names (the engine applies them to every agent;
#: none can be registered, so an event's ``policy`` names one thing).
BUILTIN_NAMES = frozenset(
    {"retry", "rate-limits", "max-steps", "budget", "tool-access", "context-fit"}
)

#: A ``before_model`` hook written as a function.
BeforeModel = Callable[[ModelCall], "ModelCall | Defer | Stop"]

P = TypeVar("P", bound=Policy)


class FunctionPolicy(Policy):
    """A policy whose only hook is ``before_model``, given as a function."""

    def __init__(self, name: str, fn: BeforeModel) -> None:
        self.name = name
        self.fn = fn

    def before_model(self, call: ModelCall) -> ModelCall | Defer | Stop:
        return self.fn(call)


def register_policy(name: str, policy: P) -> P:
    """Register ``policy`` (an instance) under ``name`` for agents to list.

    Raises:
        ConfigurationError: the name is not a valid name, a built-in
            policy's (:data:`BUILTIN_NAMES`), or another policy has it.
    """
    if not isinstance(name, str) or not re.match(NAME_PATTERN, name):
        raise ConfigurationError(f"policy name {name!r}: letters, digits, '_' and '-', 1-64")
    if not isinstance(policy, Policy):
        raise ConfigurationError(f"policy {name!r}: {policy!r} is not a Policy instance")
    if name in BUILTIN_NAMES:
        raise ConfigurationError(f"policy name {name!r} is a built-in policy's")
    existing = _policies.get(name)
    if existing is not None and existing is not policy and _origin(existing) != _origin(policy):
        raise ConfigurationError(f"two different policies are named {name!r}")
    policy.name = name
    _policies[name] = policy
    return policy


def _origin(policy: Policy) -> tuple[str, str]:
    # a module imported twice (as __main__ and by name) registers the same policy again
    source = policy.fn if isinstance(policy, FunctionPolicy) else type(policy)
    return source.__module__, source.__qualname__


class _Declare:
    """The decorator :func:`policy` returns."""

    def __init__(self, name: str) -> None:
        self.name = name

    @overload
    def __call__(self, target: type[P]) -> type[P]: ...
    @overload
    def __call__(self, target: BeforeModel) -> Policy: ...
    def __call__(self, target: type[P] | BeforeModel) -> type[P] | Policy:
        if isinstance(target, type):
            if not issubclass(target, Policy):
                raise ConfigurationError(f"policy {self.name!r}: {target!r} is not a Policy")
            register_policy(self.name, target())
            return target
        if not callable(target):
            raise ConfigurationError(f"policy {self.name!r}: {target!r} is not callable")
        return register_policy(self.name, FunctionPolicy(self.name, target))


def policy(name: str) -> _Declare:
    """Register a policy under ``name``: a :class:`Policy` subclass (made
    with no arguments; the class is returned) or a function, its
    ``before_model`` hook (the :class:`Policy` made of it is returned)::

        @policy("redact-emails")
        def redact_emails(call: ModelCall) -> ModelCall: ...
    """
    return _Declare(name)


def get_policy(name: str) -> Policy:
    """The policy registered as ``name``; :class:`UnknownPolicyError` if none is."""
    try:
        return _policies[name]
    except KeyError:
        raise UnknownPolicyError(name, list(_policies)) from None


def check_policies(names: Iterable[str]) -> None:
    """Raise :class:`UnknownPolicyError` for the first name not registered."""
    for name in names:
        get_policy(name)


def policy_names() -> list[str]:
    return sorted(_policies)
