"""A registered tool and how one call of it runs: :class:`Tool`, :class:`ToolContext`.

A tool is its spec, the function and the validator of its arguments;
:meth:`Tool.invoke` runs one call in a helper thread
(:mod:`orchestrator.tools.threads`) within the tool's timeout, watching its
job's stop flag. Tools are declared with
:func:`~orchestrator.tools.decorator.tool` (from a typed signature),
:mod:`orchestrator.tools.json_schema` (from a JSON schema) or
:mod:`orchestrator.tools.toolsets` (the tools of an MCP server).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic_core import to_jsonable_python

from orchestrator.errors import ToolExecutionError
from orchestrator.tools import threads
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
    """Run in a helper thread (:mod:`orchestrator.tools.threads`) so a timeout
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

    done = threads.start(target, f"chorus-tool-{name}")
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
