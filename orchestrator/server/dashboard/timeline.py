"""A job's events turned into what its page draws: per conversation, per
step, the model call as a bar (its first token marked) and the tool batch
as lanes (queue wait, and a wait for a person's approval, apart from run
time), segments ending at their barrier with the straggler named, waits
with their reason (a retry's backoff, a provider's 429, the agent's own
rate limits), usage and failures.

Pure: events in (the API's JSON, as dicts), a view model out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

#: Events whose call is a subagent's (its lane links to the child).
SUBAGENT_ENDS = {"subagent.completed", "subagent.failed", "subagent.stopped"}
TOOL_ENDS = {"tool.completed", "tool.failed", "tool.cancelled"}


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["time"])).timestamp()


@dataclass
class Span:
    """A stretch of time on a step's scale (seconds since the step began)."""

    start: float
    end: float

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


#: The reason of a wait for the agent's own rate limits or a provider's 429.
RATE_LIMIT = "rate limit"


@dataclass
class Wait:
    """Time a step spent not running, and why (``retry backoff``, ``rate limit``...)."""

    reason: str
    span: Span
    detail: str = ""


@dataclass
class Lane:
    """One tool call of a batch."""

    request_id: str
    tool: str
    segment: int
    parallelizable: bool
    requested: float
    started: float | None = None
    finished: float | None = None
    status: str = "pending"
    error: str | None = None
    child_conversation_id: str | None = None
    attempt: int = 1
    params: str = ""
    asked: float | None = None  # it began to wait for a person (tool.approval_requested)
    answered: float | None = None  # tool.approved or tool.denied
    answer: str = ""  # "approved" or "denied"
    answered_by: str = ""

    @property
    def name(self) -> str:
        """The tool and its arguments, short: what tells apart calls of one tool."""
        return f"{self.tool}({self.params})"

    @property
    def approval(self) -> Span | None:
        """Asked → answered (or ended unanswered): its wait for a person."""
        if self.asked is None:
            return None
        end = self.answered if self.answered is not None else self.finished
        return Span(self.asked, end if end is not None else self.asked)

    @property
    def queues(self) -> list[Span]:
        """Its waits for a worker: requested → started; for a call that
        waited for a person, requested → asked and, once approved,
        answered → started (the approval drawn apart)."""
        if self.asked is None:
            return [] if self.started is None else [Span(self.requested, self.started)]
        waits = [Span(self.requested, self.asked)]
        if self.answer == "approved" and self.answered is not None and self.started is not None:
            waits.append(Span(self.answered, self.started))
        return waits

    @property
    def queued(self) -> float:
        return sum(span.seconds for span in self.queues)

    @property
    def run(self) -> Span | None:
        if self.started is None:
            return None
        return Span(self.started, self.finished if self.finished is not None else self.started)


@dataclass
class Segment:
    number: int
    lanes: list[Lane]

    @property
    def barrier(self) -> bool:
        """A call that runs alone (not parallelizable) is a barrier of its own."""
        return any(not lane.parallelizable for lane in self.lanes)

    @cached_property
    def ends(self) -> float | None:
        """When the last call finished: where the segment's barrier stands."""
        done = [lane.finished for lane in self.lanes]
        if not done or any(d is None for d in done):
            return None
        return max(d for d in done if d is not None)

    @cached_property
    def straggler(self) -> Lane | None:
        """The call the others waited for (None for a single call)."""
        if len(self.lanes) < 2 or self.ends is None:
            return None
        return max(self.lanes, key=lambda lane: lane.finished or 0.0)


@dataclass
class Step:
    conversation_id: str
    number: int
    begins: float
    model: Span | None = None
    model_name: str = ""
    waits: list[Wait] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    lanes: dict[str, Lane] = field(default_factory=dict)
    #: Seconds from the model call's start to its first streamed token
    #: (None: not streamed, or not known).
    first_token: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    text: str = ""
    _segments: list[Segment] | None = field(default=None, repr=False)
    _ends: float | None = field(default=None, repr=False)

    @property
    def segments(self) -> list[Segment]:
        """The batch's segments (read once the events are all in: cached)."""
        if self._segments is None:
            self._segments = self._split()
        return self._segments

    def _split(self) -> list[Segment]:
        found: dict[int, list[Lane]] = {}
        for lane in self.lanes.values():
            found.setdefault(lane.segment, []).append(lane)
        return [Segment(n, found[n]) for n in sorted(found)]

    @property
    def ends(self) -> float:
        if self._ends is None:
            self._ends = self._last()
        return self._ends

    def _last(self) -> float:
        times = [self.begins]
        if self.model is not None:
            times.append(self.model.end)
        times += [w.span.end for w in self.waits]
        for lane in self.lanes.values():
            moments = (lane.asked, lane.answered, lane.started, lane.finished)
            times += [t for t in moments if t is not None]
        return max(times)

    @property
    def first_token_at(self) -> float | None:
        """When the model call's first token came (on the step's scale)."""
        if self.model is None or self.first_token is None:
            return None
        return self.model.start + self.first_token

    @property
    def seconds(self) -> float:
        return self.ends - self.begins

    def pct(self, at: float) -> float:
        """Where ``at`` falls on this step's scale, in percent."""
        total = self.seconds or 1.0
        return round(100.0 * (at - self.begins) / total, 2)

    def width(self, span: Span) -> float:
        total = self.seconds or 1.0
        return round(max(0.4, 100.0 * span.seconds / total), 2)


@dataclass
class Timeline:
    """Every step of every conversation of a job, in the order they began."""

    steps: dict[tuple[str, int], Step] = field(default_factory=dict)
    handoffs: dict[str, list[str]] = field(default_factory=dict)
    checkpoints: dict[str, int] = field(default_factory=dict)
    turn_errors: dict[str, str] = field(default_factory=dict)

    def of(self, conversation_id: str) -> list[Step]:
        return sorted(
            (s for (c, _), s in self.steps.items() if c == conversation_id),
            key=lambda s: s.number,
        )

    @property
    def failures(self) -> list[tuple[Step, dict[str, Any]]]:
        return [(s, f) for s in self.steps.values() for f in s.failures]


def _step(timeline: Timeline, event: dict[str, Any], at: float) -> Step:
    key = (str(event["conversation_id"]), int(event.get("step") or 0))
    found = timeline.steps.get(key)
    if found is None:
        found = timeline.steps[key] = Step(key[0], key[1], at)
    found.begins = min(found.begins, at)
    return found


def _short(value: Any, chars: int = 500) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= chars else text[:chars] + "…"


def _arguments(params: Any, chars: int = 60) -> str:
    if not isinstance(params, dict):
        return ""
    text = ", ".join(f"{k}={v!r}" for k, v in params.items())
    return text if len(text) <= chars else text[:chars] + "…"


def _tool_event(step: Step, name: str, data: dict[str, Any], at: float) -> None:
    rid = str(data.get("tool_request_id", ""))
    lane = step.lanes.get(rid)
    if name in ("tool.requested", "subagent.requested"):
        step.lanes[rid] = Lane(
            request_id=rid,
            tool=str(data.get("tool", "")),
            segment=int(data.get("segment") or 0),
            parallelizable=bool(data.get("parallelizable", True)),
            requested=at,
            params=_arguments(data.get("params")),
        )
        return
    if lane is None:
        return
    if name == "tool.approval_requested":
        lane.asked = at if lane.asked is None else lane.asked
        lane.status = "awaiting"
    elif name in ("tool.approved", "tool.denied"):
        lane.answered = at
        lane.answer = lane.status = name.split(".", 1)[1]
        lane.answered_by = str(data.get("by") or "")
    elif name in ("tool.started", "subagent.started"):
        lane.started = at if lane.started is None else lane.started
        lane.attempt = int(data.get("attempt") or lane.attempt)
        lane.status = "running"
        if data.get("child_conversation_id"):
            lane.child_conversation_id = str(data["child_conversation_id"])
    elif name in TOOL_ENDS or name in SUBAGENT_ENDS:
        lane.finished = at
        lane.started = at if lane.started is None else lane.started
        lane.status = name.split(".", 1)[1]
        if name in ("tool.failed", "subagent.failed"):
            lane.error = _short(data.get("error") or data.get("result"))
            step.failures.append({"kind": "tool", "tool": lane.tool, "error": lane.error})


def _model_event(step: Step, name: str, data: dict[str, Any], at: float) -> None:
    if name == "llm.requested":
        step.model_name = str(data.get("model", ""))
        step.model = Span(at, at)
        held = float(data.get("rate_limited_seconds") or 0.0)
        if held > 0:  # the agent's own rate limits deferred the call until now
            detail = f"held {held:.1f} s by the agent's rate limits before it was sent"
            step.waits.append(Wait(RATE_LIMIT, Span(at - held, at), detail))
            step.begins = min(step.begins, at - held)
    elif name == "llm.completed":
        seconds = float(data.get("seconds") or 0.0)
        step.model = Span(at - seconds, at)
        first = data.get("first_token_seconds")
        step.first_token = None if first is None else float(first)
    elif name == "llm.failed":
        failure: dict[str, Any] = {
            "kind": "model",
            "error": _short(data.get("error")),
            "status": data.get("status"),
            "body": _short(data.get("body") or ""),
            "attempt": data.get("attempt"),
        }
        step.failures.append(failure)
        retry = data.get("retry_in")
        if retry:
            reason = RATE_LIMIT if data.get("status") == 429 else "retry backoff"
            step.waits.append(Wait(reason, Span(at, at + float(retry)), failure["error"]))
    elif name == "usage":
        step.input_tokens += int(data.get("input_tokens") or 0)
        step.output_tokens += int(data.get("output_tokens") or 0)
        step.cost_usd += float(data.get("cost_usd") or 0.0)
    elif name == "assistant.message":
        step.text = _short(data.get("text") or "", 2000)


def build(events: list[dict[str, Any]]) -> Timeline:
    """The timeline of these events (in seq order)."""
    timeline = Timeline()
    for event in events:
        name = str(event["name"])
        data = event.get("data") or {}
        at = _at(event)
        conversation = str(event["conversation_id"])
        if name.startswith(("tool.", "subagent.")):
            _tool_event(_step(timeline, event, at), name, data, at)
        elif name.startswith("llm.") or name in ("usage", "assistant.message"):
            _model_event(_step(timeline, event, at), name, data, at)
        elif name == "agent.handoff":
            timeline.handoffs.setdefault(conversation, []).append(str(data.get("to_agent", "")))
        elif name == "checkpoint.completed":
            timeline.checkpoints[conversation] = timeline.checkpoints.get(conversation, 0) + 1
        elif name == "turn.failed":
            timeline.turn_errors[conversation] = _short(data.get("error"))
    for step in timeline.steps.values():
        _dispatched(step)
    return timeline


def _dispatched(step: Step) -> None:
    """A later segment's calls are sent when the one before it ends (its
    barrier): their queue wait starts there, not when the reply asked."""
    before: float | None = None
    for segment in step.segments:
        if before is not None:
            for lane in segment.lanes:
                lane.requested = max(lane.requested, before)
        before = segment.ends
        if before is None:
            return
