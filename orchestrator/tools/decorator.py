"""``@tool``: a typed Python function becomes a registered tool.

The JSON schema of its parameters comes from the signature
(:mod:`orchestrator.tools.signature`); arguments are validated before every
call. A parameter annotated :class:`~orchestrator.tools.calls.ToolContext`
receives the call's context and is not offered to the model. A tool may
live in a namespace: its registered name is then ``<namespace>.<name>``
(:func:`qualified`), offered to the model under a provider-legal alias
(:mod:`orchestrator.tools.names`). Tools declared from a JSON schema
instead of a signature are in :mod:`orchestrator.tools.json_schema`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from orchestrator import registry
from orchestrator.errors import ConfigurationError
from orchestrator.tools.calls import Tool, ToolContext
from orchestrator.tools.signature import build_params, describe, validate_params
from schemas import ToolSpec


def context_params(fn: Callable[..., Any]) -> list[str]:
    """The parameters of ``fn`` annotated :class:`ToolContext` (they receive
    the call's context and are not offered to the model)."""
    try:
        signature = inspect.signature(fn, eval_str=True)
    except Exception:  # unresolvable annotations: read them as written
        signature = inspect.signature(fn)
    return [
        p.name
        for p in signature.parameters.values()
        if p.annotation in (ToolContext, "ToolContext")
    ]


def qualified(name: str, namespace: str | None) -> str:
    """A tool's registered name: ``<namespace>.<name>``, or ``name`` alone."""
    return name if namespace is None else f"{namespace}.{name}"


def tool_spec(name: str, namespace: str | None = None, **fields: Any) -> ToolSpec:
    """The spec of tool ``name`` in ``namespace``; a name or namespace that
    cannot be registered raises :class:`ConfigurationError` naming it."""
    if namespace is not None and (not namespace or namespace != namespace.strip()):
        raise ConfigurationError(f"tool {name!r}: invalid namespace {namespace!r}")
    full = qualified(name, namespace)
    try:
        return ToolSpec(name=full, **fields)
    except ValidationError as exc:
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigurationError(f"tool {full!r}: {detail}") from None


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    namespace: str | None = None,
    description: str | None = None,
    parallelizable: bool = True,
    queue: str = "tools",
    timeout: float = 300.0,
    approval: bool = False,
    approval_timeout: float | None = None,
) -> Any:
    """Register a function as a tool. Use bare (``@tool``) or with options.

    Args:
        name: the tool's name (default: the function's name).
        namespace: registers the tool as ``<namespace>.<name>``; the model
            sees a provider-legal alias (``weather.forecast`` is offered as
            ``weather__forecast``).
        description: what the model is told (default: the docstring summary).
        parallelizable: False makes each call a barrier: it runs alone,
            after every earlier call of the batch and before every later one.
        queue: the Celery queue its calls run on.
        timeout: seconds before a call is recorded as failed.
        approval: every call waits for a person's answer before it runs
            (``Client.approve`` / ``Client.deny``; no worker slot is held
            while it waits); denied, the model gets an error result.
        approval_timeout: seconds a call waits for an answer before it is
            denied ("no answer in N s"); None: no limit.
    """

    def decorate(f: Callable[..., Any]) -> Tool:
        ctx_params = context_params(f)
        params_model, schema = build_params(f, skip=set(ctx_params))
        spec = tool_spec(
            name or f.__name__,
            namespace,
            description=description if description is not None else describe(f),
            parameters=schema,
            parallelizable=parallelizable,
            queue=queue,
            timeout=timeout,
            approval=approval,
            approval_timeout=approval_timeout,
        )
        t = Tool(
            spec=spec,
            fn=f,
            arguments=functools.partial(validate_params, params_model, tool=spec.name),
            context_param=next(iter(ctx_params), None),
        )
        registry.register_tool(t)
        return t

    return decorate(fn) if fn is not None else decorate
