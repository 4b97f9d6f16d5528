"""``@tool``: a typed Python function becomes a registered tool.

The JSON schema of its parameters comes from the signature; arguments are
validated before every call. A parameter annotated :class:`ToolContext`
receives the call's context and is not offered to the model. A tool may
live in a namespace: its registered name is then ``<namespace>.<name>``
(:func:`qualified`), offered to the model under a provider-legal alias
(:mod:`orchestrator.toolnames`). Tools declared from a JSON schema instead
of a signature are in :mod:`orchestrator.schematools`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from pydantic_core import to_jsonable_python

from orchestrator import registry, toolthreads
from orchestrator.errors import ConfigurationError, ToolExecutionError
from orchestrator.toolschema import build_params, describe, validate_params
from schemas import ToolSpec


@dataclass(frozen=True)
class ToolContext:
    """What a tool knows about the call it serves.

    ``tool_request_id`` is unique per call and stable across redeliveries:
    use it as the idempotency key of any side effect. It is Chorus's id of
    the call (its row), not the id the model's provider gave the call,
    which may repeat (servers that number calls per reply) and stays on the
    wire and in the events' ``tool_request_id``.
    """

    conversation_id: str
    root_id: str
    turn_id: str
    tool_request_id: str
    context_data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Tool:
    """A registered tool: its spec, the function and its argument validator.

    ``arguments`` validates the arguments the model sent and returns the
    keyword arguments ``fn`` is called with (raising
    :class:`~orchestrator.errors.InvalidRequestError`).
    """

    spec: ToolSpec
    fn: Callable[..., Any]
    arguments: Callable[[dict[str, Any]], dict[str, Any]]
    context_param: str | None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def invoke(
        self,
        params: dict[str, Any],
        ctx: ToolContext,
        should_stop: Callable[[], bool] | None = None,
    ) -> Any:
        """Validate ``params``, run the function within the tool's timeout.

        Returns the JSON-ready result. Raises
        :class:`~orchestrator.errors.InvalidRequestError` for bad arguments and
        :class:`~orchestrator.errors.ToolExecutionError` when it raises or
        times out (the original exception is the ``__cause__``), and
        :class:`ToolStopped` as soon as ``should_stop()`` is true (the job
        was cancelled or ran out of budget).
        """
        kwargs = self.arguments(params)
        if self.context_param:
            kwargs[self.context_param] = ctx
        value = run_with_timeout(self.fn, kwargs, self.spec.timeout, self.spec.name, should_stop)
        try:
            return to_jsonable_python(value)
        except Exception as exc:
            raise ToolExecutionError(
                f"tool {self.spec.name!r} returned a value that is not JSON: {type(value)}"
            ) from exc


class ToolStopped(Exception):
    """The call's job is stopping: the task leaves without a result (the
    stop records the call ``cancelled``)."""


#: How often a running tool looks at its job's stop flag, in seconds.
STOP_POLL = 0.5


def run_with_timeout(
    fn: Callable[..., Any],
    kwargs: dict[str, Any],
    timeout: float,
    name: str,
    should_stop: Callable[[], bool] | None = None,
) -> Any:
    """Run in a helper thread (:mod:`orchestrator.toolthreads`) so a timeout
    and a stop work in every pool (a timed-out or stopped function keeps
    running in its daemon thread until it returns; the task, and its worker
    slot, are free at once)."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            value = fn(**kwargs)
            if inspect.isawaitable(value):
                value = asyncio.run(_await(value))
            outcome["value"] = value
        except BaseException as exc:
            outcome["error"] = exc

    done = toolthreads.start(target, f"chorus-tool-{name}")
    deadline = time.monotonic() + timeout
    while not done.is_set() and (left := deadline - time.monotonic()) > 0:
        done.wait(min(left, STOP_POLL) if should_stop else left)
        if not done.is_set() and should_stop is not None and should_stop():
            raise ToolStopped(name)
    if not done.is_set():
        raise ToolExecutionError(f"tool {name!r} timed out after {timeout:g}s")
    if "error" in outcome:
        exc = outcome["error"]
        if isinstance(exc, ToolExecutionError):
            raise exc  # already says which tool failed and how
        raise ToolExecutionError(f"tool {name!r} raised {type(exc).__name__}: {exc}") from exc
    return outcome.get("value")


async def _await(value: Any) -> Any:
    return await value


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
