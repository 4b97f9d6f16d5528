"""OpenTelemetry traces of jobs: one trace a job, across every worker process.

Spans (names and attributes in the README, "Tracing"):

- ``invoke_agent {agent}``: a turn, the job's root one and each subagent's;
- ``step {n}``: one model call and the tool batch it asked for;
- ``chat {model}``: each model call (GenAI semantic conventions);
- ``execute_tool {tool}``: each tool call, a subagent call included;
- ``chorus.advance``: the control task that moves the cursor.

A turn and a step run across several Celery tasks, possibly redelivered or
re-sent by the sweeper, so no process holds their span open: their span ids
are derived from what every task reads anyway (a turn's id, a step's number,
a call's id), and the span is sent by whichever task ends it (a turn's at
its end, with the turn's stored start). A step's tools, run by other
processes, name the step's span as their parent without being told; a
child's turn names its subagent call's span. Only the trace id travels
(:mod:`orchestrator.trace_context`); spans are sent by the process's
exporter (:mod:`orchestrator.trace_export`).

With no ``OTEL_EXPORTER_OTLP_ENDPOINT`` (nor ``…_TRACES_ENDPOINT``) set,
every hook returns a shared no-op and the OpenTelemetry SDK is never
imported. Each hook here is the one call the engine makes at that point.
"""

from __future__ import annotations

import contextvars
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from orchestrator.logs import redact
from orchestrator.trace_context import (
    JobTrace,
    call_span_id,
    job_trace,
    propagate,
    random_span_id,
    sending,
    step_span_id,
    submitted,
    turn_span_id,
)
from orchestrator.trace_export import Span, current, enabled, flush, send, start

__all__ = [
    "JobTrace",
    "advance",
    "enabled",
    "flush",
    "model_call",
    "propagate",
    "provider_and_model",
    "sending",
    "start",
    "step",
    "submitted",
    "tool_call",
    "turn_ended",
]

#: Environment variables that opt in to message contents on spans.
CONTENT_VARIABLES = ("CHORUS_TRACE_CONTENT", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
#: Content attributes are cut to this many characters.
CONTENT_CHARS = 16_000

#: litellm provider prefixes whose GenAI ``gen_ai.provider.name`` differs.
_PROVIDERS = {
    "azure": "azure.ai.openai",
    "azure_ai": "azure.ai.inference",
    "bedrock": "aws.bedrock",
    "vertex_ai": "gcp.vertex_ai",
    "gemini": "gcp.gemini",
    "mistral": "mistral_ai",
    "xai": "x_ai",
    "watsonx": "ibm.watsonx.ai",
}


def _content() -> bool:
    return any(os.environ.get(v, "").strip().lower() == "true" for v in CONTENT_VARIABLES)


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return redact(text[:CONTENT_CHARS])


@dataclass
class _Run:
    """What :func:`_spanning` hands its span's builder: when the body began, what it raised."""

    began: int = field(default_factory=time.time_ns)
    failure: BaseException | None = None

    def error(self) -> str | None:
        exc = self.failure
        return None if exc is None else redact(f"{type(exc).__name__}: {exc}")[:1000]


@contextmanager
def _spanning(build: Callable[[_Run], Span | None]) -> Iterator[_Run]:
    """Run the body, then send the span ``build`` makes of it (None: no span)."""
    run = _Run()
    try:
        yield run
    except BaseException as exc:
        run.failure = exc
        raise
    finally:
        span = build(run)
        if span is not None:
            send(span)


def _position(conversation_id: str, turn_id: str, step: int) -> dict[str, Any]:
    return {
        "gen_ai.conversation.id": conversation_id,
        "chorus.turn.id": turn_id,
        "chorus.step": step,
    }


# --- turns ---------------------------------------------------------------------


class _TurnRow(Protocol):
    id: str
    conversation_id: str
    agent: str
    job_id: str | None
    parent_call_id: str | None
    started_at: datetime
    steps: int


def turn_ended(turn: _TurnRow, status: str) -> None:
    """Send the span of ``turn``, ended now with ``status``: a job's root
    turn, or a subagent's (a child of its call's span)."""
    if not enabled():
        return
    job = job_trace(turn.job_id or turn.id)
    parent = call_span_id(turn.parent_call_id) if turn.parent_call_id else job.parent_id
    started = turn.started_at.timestamp() if turn.started_at else time.time()
    send(
        Span(
            f"invoke_agent {turn.agent}",
            job,
            turn_span_id(turn.id),
            parent,
            int(started * 1e9),
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": turn.agent,
                "gen_ai.conversation.id": turn.conversation_id,
                "chorus.job.id": turn.job_id or turn.id,
                "chorus.turn.id": turn.id,
                "chorus.turn.status": status,
                "chorus.steps": turn.steps,
            },
            error=None if status == "completed" else f"turn {status}",
        )
    )


# --- steps and model calls -----------------------------------------------------


@dataclass
class _Step:
    """The step a task serves: what its model calls' spans need."""

    trace: JobTrace
    conversation_id: str
    turn_id: str
    step: int
    attempt_id: int  # the span id of an execution that got no reply
    failed: bool = False


_step: contextvars.ContextVar[_Step | None] = contextvars.ContextVar("chorus_step", default=None)


def step(ids: tuple[str, str, int], answered: Sequence[Any]) -> AbstractContextManager[Any]:
    """Around one execution of a step (``ids``: conversation, turn, step).
    Sends ``step {n}`` if the model answered (``answered`` holds the reply;
    the span's id is the step's, which its tools name as their parent) or a
    model call failed (an attempt of its own); an execution that only
    deferred or left sends nothing."""
    if not enabled():
        return nullcontext()
    return _step_span(ids, answered)


@contextmanager
def _step_span(ids: tuple[str, str, int], answered: Sequence[Any]) -> Iterator[None]:
    conversation_id, turn_id, number = ids
    served = _Step(job_trace(turn_id), conversation_id, turn_id, number, random_span_id())

    def build(run: _Run) -> Span | None:
        if not answered and not served.failed:
            return None
        reply = answered[0] if answered else None
        attributes = _position(conversation_id, turn_id, number)
        if reply is not None:
            attributes["chorus.tool_calls"] = len(reply.tool_calls)
            attributes["chorus.cost_usd"] = reply.usage.cost_usd
        return Span(
            f"step {number}",
            served.trace,
            step_span_id(turn_id, number) if reply is not None else served.attempt_id,
            turn_span_id(turn_id),
            run.began,
            attributes,
            error=run.error() or (None if reply is not None else "model call failed"),
        )

    token = _step.set(served)
    try:
        with _spanning(build):
            yield
    finally:
        _step.reset(token)


class ModelSpan:
    """What :func:`model_call` yields: give it the reply."""

    def reply(self, reply: Any) -> None:
        """The model's reply (its usage and finish reason go on the span)."""


_NO_MODEL_SPAN = ModelSpan()


class _ModelSpan(ModelSpan):
    def __init__(self) -> None:
        self.answer: Any = None

    def reply(self, reply: Any) -> None:
        self.answer = reply


def model_call(
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    settings: Mapping[str, Any],
) -> AbstractContextManager[ModelSpan]:
    """Around one model call: ``chat {model}``, a child of its step's span."""
    served = _step.get() if enabled() else None
    if served is None:
        return nullcontext(_NO_MODEL_SPAN)
    return _model_span(served, model, (messages, tools), settings)


def provider_and_model(model: str) -> tuple[str, str]:
    """``gen_ai.provider.name`` and ``gen_ai.request.model`` of a litellm model string."""
    prefix, slash, rest = model.partition("/")
    if not slash:
        return "openai", model
    return _PROVIDERS.get(prefix, prefix), rest


@contextmanager
def _model_span(
    served: _Step,
    model: str,
    request: tuple[list[dict[str, Any]], list[dict[str, Any]] | None],
    settings: Mapping[str, Any],
) -> Iterator[ModelSpan]:
    provider, requested = provider_and_model(model)
    span = _ModelSpan()

    def build(run: _Run) -> Span:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": requested,
            "gen_ai.conversation.id": served.conversation_id,
        }
        for key in ("temperature", "max_tokens", "top_p", "seed"):
            if isinstance(settings.get(key), int | float):
                attributes[f"gen_ai.request.{key}"] = settings[key]
        if span.answer is not None:
            _answered(attributes, span.answer)
        if _content():
            messages, tools = request
            attributes["gen_ai.input.messages"] = _text(messages)
            if tools:
                attributes["gen_ai.tool.definitions"] = _text(tools)
        if run.failure is not None:
            attributes["error.type"] = type(run.failure).__name__
            served.failed = True
        parent = (
            served.attempt_id
            if run.failure is not None
            else step_span_id(served.turn_id, served.step)
        )
        return Span(
            f"chat {requested}",
            served.trace,
            random_span_id(),
            parent,
            run.began,
            attributes,
            kind="CLIENT",
            error=run.error(),
        )

    with _spanning(build):
        yield span


def _answered(attributes: dict[str, Any], reply: Any) -> None:
    calls = reply.tool_calls
    reason = reply.finish_reason or ("tool_calls" if calls else "stop")
    attributes.update(
        {
            "gen_ai.usage.input_tokens": reply.usage.input_tokens,
            "gen_ai.usage.output_tokens": reply.usage.output_tokens,
            "gen_ai.response.finish_reasons": [reason],
            "chorus.cost_usd": reply.usage.cost_usd,
        }
    )
    if _content():
        parts: list[dict[str, Any]] = (
            [{"type": "text", "content": reply.text}] if reply.text else []
        )
        parts += [
            {"type": "tool_call", "id": c.tool_request_id, "name": c.tool, "arguments": c.params}
            for c in calls
        ]
        attributes["gen_ai.output.messages"] = _text(
            [{"role": "assistant", "parts": parts, "finish_reason": reason}]
        )


# --- tool calls and the advance ------------------------------------------------


class ToolSpan:
    """What :func:`tool_call` yields: give it the result."""

    def result(self, result: Any, is_error: bool) -> None:
        """The call's result, and whether it is an error result."""


_NO_TOOL_SPAN = ToolSpan()


class _ToolSpan(ToolSpan):
    def __init__(self) -> None:
        self.outcome: tuple[Any, bool] | None = None

    def result(self, result: Any, is_error: bool) -> None:
        self.outcome = (result, is_error)


def tool_call(
    call: Any, ids: tuple[str, str], *, subagent: bool = False
) -> AbstractContextManager[ToolSpan]:
    """Around one tool call's run, or a subagent call's start:
    ``execute_tool {tool}``, a child of its step's span; a subagent's turn
    is a child of it. ``call``: the claimed call (its ``id``, ``tool``,
    ``tool_request_id``, ``params``, ``attempts`` and ``step``); ``ids``:
    its conversation and turn."""
    if not enabled():
        return nullcontext(_NO_TOOL_SPAN)
    return _tool_span(call, ids, subagent)


@contextmanager
def _tool_span(call: Any, ids: tuple[str, str], subagent: bool) -> Iterator[ToolSpan]:
    conversation_id, turn_id = ids
    job = job_trace(turn_id)
    span_id = call_span_id(call.id)
    span = _ToolSpan()

    def build(run: _Run) -> Span:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.tool,
            "gen_ai.tool.call.id": call.tool_request_id,
            "gen_ai.tool.type": "agent" if subagent else "function",
            "gen_ai.conversation.id": conversation_id,
            "chorus.tool_call.id": call.id,
            "chorus.attempt": call.attempts,
        }
        error = run.error()
        if span.outcome is not None and span.outcome[1]:
            attributes["error.type"] = "tool_error"
            error = _text(span.outcome[0])[:1000]
        if _content():
            attributes["gen_ai.tool.call.arguments"] = _text(call.params)
            if span.outcome is not None:
                attributes["gen_ai.tool.call.result"] = _text(span.outcome[0])
        parent = step_span_id(turn_id, call.step)
        return Span(
            f"execute_tool {call.tool}", job, span_id, parent, run.began, attributes, error=error
        )

    with _spanning(build), current(job, span_id):
        yield span


def advance(
    conversation_id: str, turn_id: str, step: int, segment: int
) -> AbstractContextManager[Any]:
    """Around a ``chorus.advance`` task: a child of its step's span."""
    if not enabled():
        return nullcontext()
    job = job_trace(turn_id)
    attributes = {**_position(conversation_id, turn_id, step), "chorus.segment": segment}
    return _spanning(
        lambda run: Span(
            "chorus.advance",
            job,
            random_span_id(),
            step_span_id(turn_id, step),
            run.began,
            attributes,
            error=run.error(),
        )
    )
