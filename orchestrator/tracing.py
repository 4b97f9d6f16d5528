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
child's turn names its subagent call's span. Only the trace id travels, in
one Celery message header (:data:`HEADER`) that every traced task passes on
to the tasks it sends; a task sent without it (the first step of a job
submitted without a trace parent) takes the trace id derived from its job's
id, as the job's other tasks do.

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``…_TRACES_ENDPOINT``) is set:
then every hook returns a shared no-op and the OpenTelemetry SDK is never
imported. On, each process builds its exporter (OTLP over HTTP, batched) at
its first span, so a prefork child has its own, made after the fork.
"""

from __future__ import annotations

import contextvars
import hashlib
import importlib.util
import json
import logging
import os
import random
import re
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from orchestrator.errors import InvalidRequestError
from orchestrator.logs import redact

#: The Celery message header carrying a job's trace (``00-{trace}-{parent}-{flags}``).
HEADER = "chorus_trace"
#: Tasks that run no job's work: they pass no trace on (a turn a dequeue
#: starts is a new job, with its own trace).
UNTRACED_TASKS = frozenset({"chorus.dequeue", "chorus.sweep"})
#: Environment variables that opt in to message contents on spans.
CONTENT_VARIABLES = ("CHORUS_TRACE_CONTENT", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
#: Content attributes are cut to this many characters.
CONTENT_CHARS = 16_000

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
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

_enabled: bool | None = None


def enabled() -> bool:
    """Is an OTLP endpoint configured (and the SDK not disabled)? Read once a process."""
    global _enabled
    if _enabled is None:
        env = os.environ
        off = env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or (
            env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none"
        )
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        _enabled = bool(endpoint) and not off and _installed()
    return _enabled


def _installed() -> bool:
    if importlib.util.find_spec("opentelemetry.sdk") is not None:
        return True
    logging.getLogger(__name__).warning(
        "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed "
        "(pip install 'chorus[tracing]'): no traces are sent"
    )
    return False


def _content() -> bool:
    return any(os.environ.get(v, "").strip().lower() == "true" for v in CONTENT_VARIABLES)


# --- the job's trace, carried from task to task ------------------------------


@dataclass(frozen=True)
class JobTrace:
    """A job's trace id, and the span its root turn is a child of (0: none;
    an API request's span when the job was submitted with a trace parent)."""

    trace_id: int
    parent_id: int = 0
    sampled: bool = True

    def header(self) -> str:
        return f"00-{self.trace_id:032x}-{self.parent_id:016x}-{int(self.sampled):02x}"

    @classmethod
    def parse(cls, value: object, *, field: str = HEADER) -> JobTrace:
        """A W3C ``traceparent`` (or this header); InvalidRequestError naming
        ``field`` if it is not one."""
        found = _TRACEPARENT.match(value.strip().lower()) if isinstance(value, str) else None
        if found is None or found.group(1) == "ff" or int(found.group(2), 16) == 0:
            raise InvalidRequestError(
                f"{field}: a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>) is required, "
                f"not {str(value)[:80]!r}",
                [field],
            )
        trace, parent, flags = found.group(2, 3, 4)
        return cls(int(trace, 16), int(parent, 16), bool(int(flags, 16) & 1))


_job: contextvars.ContextVar[JobTrace | None] = contextvars.ContextVar("chorus_job", default=None)


def _hash(size: int, *parts: object) -> int:
    text = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=size).digest(), "big") or 1


def _random_id() -> int:
    return random.getrandbits(64) or 1


def trace_id_of(job_id: str) -> int:
    """The trace id of a job carried without a header: derived from its id."""
    return _hash(16, "job", job_id)


def turn_span_id(turn_id: str) -> int:
    return _hash(8, "turn", turn_id)


def step_span_id(turn_id: str, step: int) -> int:
    return _hash(8, "step", turn_id, step)


def call_span_id(call_id: str) -> int:
    return _hash(8, "call", call_id)


def _trace(job_id: str) -> JobTrace:
    return _job.get() or JobTrace(trace_id_of(job_id))


def submitted(trace_parent: str | None) -> JobTrace | None:
    """The trace a job submitted now joins: ``trace_parent`` (a W3C
    ``traceparent``), else the caller's current OpenTelemetry span if the
    caller uses OpenTelemetry; None: the job's own trace."""
    if trace_parent is not None:
        return JobTrace.parse(trace_parent, field="trace_parent")
    if "opentelemetry.trace" not in sys.modules:
        return None  # the caller uses no OpenTelemetry: nothing is current
    from opentelemetry import trace

    current = trace.get_current_span().get_span_context()
    if not current.is_valid:
        return None
    return JobTrace(current.trace_id, current.span_id, current.trace_flags.sampled)


def sending(job: JobTrace | None) -> AbstractContextManager[Any]:
    """Within it, tasks sent carry ``job``'s trace (the client's submit)."""
    if job is None:
        return nullcontext()
    propagate()
    return _joined(job)


@contextmanager
def _joined(job: JobTrace) -> Iterator[None]:
    token = _job.set(job)
    try:
        yield
    finally:
        _job.reset(token)


_propagating = False


def propagate() -> None:
    """Connect the Celery signals that pass a job's trace on: a task sent
    carries the trace of the task sending it; a task run takes its own."""
    global _propagating
    if _propagating:
        return
    from celery.signals import before_task_publish, task_postrun, task_prerun

    before_task_publish.connect(_on_publish, weak=False)
    task_prerun.connect(_on_prerun, weak=False)
    task_postrun.connect(_on_postrun, weak=False)
    _propagating = True


def _on_publish(headers: dict[str, Any] | None = None, **_: Any) -> None:
    job = _job.get()
    if job is not None and headers is not None and HEADER not in headers:
        headers[HEADER] = job.header()


def _on_prerun(task: Any = None, **_: Any) -> None:
    value = getattr(task.request, HEADER, None) if task is not None else None
    job = None
    if value is not None and task.name not in UNTRACED_TASKS:
        try:
            job = JobTrace.parse(value)
        except InvalidRequestError:
            job = None  # a header no Chorus process wrote: the job's own trace
    _job.set(job)


def _on_postrun(**_: Any) -> None:
    _job.set(None)


# --- sending spans -------------------------------------------------------------


@dataclass
class _Span:
    """A finished span, built here and sent by the process's :class:`_Sink`."""

    name: str
    trace: JobTrace
    span_id: int
    parent_id: int
    start_ns: int
    attributes: dict[str, Any]
    kind: str = "INTERNAL"
    error: str | None = None
    end_ns: int = field(default_factory=time.time_ns)


class _Sink:
    """The process's exporter: OTLP over HTTP behind a batch processor, and
    a tracer provider on the same processor for spans a tool makes itself
    (set as the global one unless the application set its own)."""

    def __init__(self) -> None:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        name = os.environ.get("OTEL_SERVICE_NAME") or "chorus"
        self.resource = Resource.create({"service.name": name})
        self.scope = InstrumentationScope("chorus")
        self.processor = BatchSpanProcessor(OTLPSpanExporter())
        self.provider = TracerProvider(resource=self.resource)
        self.provider.add_span_processor(self.processor)
        if type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider":
            trace.set_tracer_provider(self.provider)

    def send(self, span: _Span) -> None:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        flags = TraceFlags(TraceFlags.SAMPLED if span.trace.sampled else 0)
        if not span.trace.sampled:
            return
        parent = (
            SpanContext(span.trace.trace_id, span.parent_id, True, flags)
            if span.parent_id
            else None
        )
        status = Status(StatusCode.ERROR, span.error) if span.error is not None else Status()
        self.processor.on_end(
            ReadableSpan(
                span.name,
                SpanContext(span.trace.trace_id, span.span_id, False, flags),
                parent,
                self.resource,
                span.attributes,
                kind=SpanKind[span.kind],
                status=status,
                start_time=span.start_ns,
                end_time=span.end_ns,
                instrumentation_scope=self.scope,
            )
        )


_sink: tuple[int, _Sink] | None = None
_sink_lock = threading.Lock()


def start() -> None:
    """Build this process's exporter now (a worker, once it runs), not at its first span."""
    if enabled():
        _process_sink()


def _process_sink() -> _Sink:
    global _sink
    with _sink_lock:
        if _sink is None or _sink[0] != os.getpid():  # a forked child builds its own
            _sink = (os.getpid(), _Sink())
        return _sink[1]


def _send(span: _Span) -> None:
    _process_sink().send(span)


def flush() -> None:
    """Send the spans still batched (a process about to exit)."""
    if _sink is not None and _sink[0] == os.getpid():
        _sink[1].processor.force_flush(5_000)


@contextmanager
def _current(trace: JobTrace, span_id: int) -> Iterator[None]:
    """``span_id`` as the OpenTelemetry current span: spans a tool or a model
    client makes itself are its children."""
    from opentelemetry import context
    from opentelemetry import trace as api

    parent = api.SpanContext(trace.trace_id, span_id, False, api.TraceFlags(int(trace.sampled)))
    token = context.attach(api.set_span_in_context(api.NonRecordingSpan(parent)))
    try:
        yield
    finally:
        context.detach(token)


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return redact(text[:CONTENT_CHARS])


def _error(exc: BaseException | None) -> str | None:
    return None if exc is None else redact(f"{type(exc).__name__}: {exc}")[:1000]


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
    job = _trace(turn.job_id or turn.id)
    parent = call_span_id(turn.parent_call_id) if turn.parent_call_id else job.parent_id
    started = turn.started_at.timestamp() if turn.started_at else time.time()
    _send(
        _Span(
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
    current = _Step(_trace(turn_id), conversation_id, turn_id, number, _random_id())
    token = _step.set(current)
    began = time.time_ns()
    failure: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        failure = exc
        raise
    finally:
        _step.reset(token)
        if answered or current.failed:
            reply = answered[0] if answered else None
            attributes: dict[str, Any] = {
                "gen_ai.conversation.id": conversation_id,
                "chorus.turn.id": turn_id,
                "chorus.step": number,
            }
            if reply is not None:
                attributes["chorus.tool_calls"] = len(reply.tool_calls)
                attributes["chorus.cost_usd"] = reply.usage.cost_usd
            _send(
                _Span(
                    f"step {number}",
                    current.trace,
                    step_span_id(turn_id, number) if reply is not None else current.attempt_id,
                    turn_span_id(turn_id),
                    began,
                    attributes,
                    error=_error(failure) or (None if reply is not None else "model call failed"),
                )
            )


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
    if not enabled() or _step.get() is None:
        return nullcontext(_NO_MODEL_SPAN)
    return _model_span(model, messages, tools, settings)


def provider_and_model(model: str) -> tuple[str, str]:
    """``gen_ai.provider.name`` and ``gen_ai.request.model`` of a litellm model string."""
    prefix, slash, rest = model.partition("/")
    if not slash:
        return "openai", model
    return _PROVIDERS.get(prefix, prefix), rest


@contextmanager
def _model_span(
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    settings: Mapping[str, Any],
) -> Iterator[ModelSpan]:
    current = _step.get()
    assert current is not None
    provider, requested = provider_and_model(model)
    span = _ModelSpan()
    began = time.time_ns()
    failure: BaseException | None = None
    try:
        yield span
    except BaseException as exc:
        failure = exc
        raise
    finally:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": requested,
            "gen_ai.conversation.id": current.conversation_id,
        }
        for key in ("temperature", "max_tokens", "top_p", "seed"):
            if isinstance(settings.get(key), int | float):
                attributes[f"gen_ai.request.{key}"] = settings[key]
        if span.answer is not None:
            _answered(attributes, span.answer)
        if _content():
            attributes["gen_ai.input.messages"] = _text(messages)
            if tools:
                attributes["gen_ai.tool.definitions"] = _text(tools)
        if failure is not None:
            attributes["error.type"] = type(failure).__name__
            current.failed = True
        parent = (
            current.attempt_id
            if failure is not None
            else step_span_id(current.turn_id, current.step)
        )
        _send(
            _Span(
                f"chat {requested}",
                current.trace,
                _random_id(),
                parent,
                began,
                attributes,
                kind="CLIENT",
                error=_error(failure),
            )
        )


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


class _Call(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def tool(self) -> str: ...
    @property
    def tool_request_id(self) -> str: ...
    @property
    def params(self) -> dict[str, Any]: ...
    @property
    def attempts(self) -> int: ...
    @property
    def step(self) -> int: ...


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
    call: _Call, ids: tuple[str, str], *, subagent: bool = False
) -> AbstractContextManager[ToolSpan]:
    """Around one tool call's run (``ids``: its conversation and turn), or a
    subagent call's start: ``execute_tool {tool}``, a child of its step's
    span; a subagent's turn is a child of it."""
    if not enabled():
        return nullcontext(_NO_TOOL_SPAN)
    return _tool_span(call, ids, subagent)


@contextmanager
def _tool_span(call: _Call, ids: tuple[str, str], subagent: bool) -> Iterator[ToolSpan]:
    conversation_id, turn_id = ids
    job = _trace(turn_id)
    span_id = call_span_id(call.id)
    span = _ToolSpan()
    began = time.time_ns()
    failure: BaseException | None = None
    try:
        with _current(job, span_id):
            yield span
    except BaseException as exc:
        failure = exc
        raise
    finally:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.tool,
            "gen_ai.tool.call.id": call.tool_request_id,
            "gen_ai.tool.type": "agent" if subagent else "function",
            "gen_ai.conversation.id": conversation_id,
            "chorus.tool_call.id": call.id,
            "chorus.attempt": call.attempts,
        }
        error = _error(failure)
        if span.outcome is not None and span.outcome[1]:
            attributes["error.type"] = "tool_error"
            error = _text(span.outcome[0])[:1000]
        if _content():
            attributes["gen_ai.tool.call.arguments"] = _text(call.params)
            if span.outcome is not None:
                attributes["gen_ai.tool.call.result"] = _text(span.outcome[0])
        _send(
            _Span(
                f"execute_tool {call.tool}",
                job,
                span_id,
                step_span_id(turn_id, call.step),
                began,
                attributes,
                error=error,
            )
        )


def advance(
    conversation_id: str, turn_id: str, step: int, segment: int
) -> AbstractContextManager[Any]:
    """Around a ``chorus.advance`` task: a child of its step's span."""
    if not enabled():
        return nullcontext()
    return _advance_span(conversation_id, turn_id, step, segment)


@contextmanager
def _advance_span(conversation_id: str, turn_id: str, step: int, segment: int) -> Iterator[None]:
    began = time.time_ns()
    failure: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        failure = exc
        raise
    finally:
        _send(
            _Span(
                "chorus.advance",
                _trace(turn_id),
                _random_id(),
                step_span_id(turn_id, step),
                began,
                {
                    "gen_ai.conversation.id": conversation_id,
                    "chorus.turn.id": turn_id,
                    "chorus.step": step,
                    "chorus.segment": segment,
                },
                error=_error(failure),
            )
        )
