"""A job's trace: its id, carried from task to task, and the span ids
every task derives from durable positions (see :mod:`orchestrator.tracing`).

Only the trace id travels, in one Celery message header (:data:`HEADER`)
that every traced task passes on to the tasks it sends
(``before_task_publish``, read back at ``task_prerun``); a task sent without
it takes the trace id derived from its job's id.
"""

from __future__ import annotations

import contextvars
import hashlib
import random
import re
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import InvalidRequestError

#: The Celery message header carrying a job's trace (``00-{trace}-{parent}-{flags}``).
HEADER = "chorus_trace"
#: Tasks that run no job's work: they pass no trace on (a turn a dequeue
#: starts is a new job, with its own trace).
UNTRACED_TASKS = frozenset({"chorus.dequeue", "chorus.sweep"})

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


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


def random_span_id() -> int:
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


def job_trace(job_id: str) -> JobTrace:
    """The trace of the task running now, else the one derived from ``job_id``."""
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
