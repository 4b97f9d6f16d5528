"""What the engine asks the dispatcher to run next."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class RunStep:
    """Call the model for ``step`` of the turn (task ``chorus.step``)."""

    conversation_id: str
    turn_id: str
    step: int
    priority: int  # the job's (schemas.jobs: 0-9, higher first), as every action's
    countdown: float = 0.0  # seconds to wait first (a retry's backoff)


@dataclass(frozen=True)
class ToolTask:
    call_id: str
    tool: str
    queue: str


@dataclass(frozen=True)
class RunSegment:
    """Run one segment of a tool batch, then ``chorus.advance``.

    Several calls run as a chord over a group; a single call (a barrier, or
    a lone parallelizable call) as a chain. ``countdown``: seconds to wait
    first (a call a policy deferred, sent again alone with its advance).
    """

    conversation_id: str
    turn_id: str
    step: int
    segment: int
    calls: tuple[ToolTask, ...]
    priority: int
    countdown: float = 0.0


@dataclass(frozen=True)
class RunAdvance:
    """Try to advance a segment now (task ``chorus.advance``): a subagent's
    end answers its parent's call outside any chord.

    ``if_ready``: needed only if no call of the segment is still out when
    read after the answer's commit (:func:`~orchestrator.engine.after_commit.settle`
    drops it otherwise: of N children answering, the last one advances).
    Sent as is where nothing checks."""

    conversation_id: str
    turn_id: str
    step: int
    segment: int
    priority: int
    if_ready: bool = False


@dataclass(frozen=True)
class Dequeue:
    """Start the next queued message of a conversation if it is idle
    (task ``chorus.dequeue``).

    ``if_waiting``: needed only if the conversation's inbox holds a
    message when read after the commit that ended its turn
    (:func:`~orchestrator.engine.after_commit.settle`). Sent as is where nothing
    checks."""

    conversation_id: str
    if_waiting: bool = False


@dataclass(frozen=True)
class Revoke:
    """Revoke these tasks (tool calls of a stopped tree; their ids are the call ids)."""

    task_ids: tuple[str, ...]


@dataclass(frozen=True)
class TakeCheckpoint:
    """Summarize a conversation in the background (task ``chorus.checkpoint``)."""

    conversation_id: str
    priority: int
    countdown: float = 0.0  # seconds to wait first (over a rate limit)


@dataclass(frozen=True)
class Deadline:
    """Look at the job's wall-time budget after ``countdown`` seconds and
    stop it if spent (task ``chorus.deadline``)."""

    job_id: str
    countdown: float
    priority: int


Action = RunStep | RunSegment | RunAdvance | Dequeue | Revoke | TakeCheckpoint | Deadline


@dataclass(frozen=True)
class Position:
    """A cursor position, as named by the id of the task that serves it.

    ``segment`` is ``-1`` for a step's model call, else the tool segment
    whose ``chorus.advance`` the task is."""

    conversation_id: str
    turn_id: str
    step: int
    segment: int


def step_task_id(conversation_id: str, turn_id: str, step: int) -> str:
    """Every copy of a step's task has this id, so a copy is recognisable
    in the broker (the sweeper's "is it still queued?")."""
    return f"step:{conversation_id}:{turn_id}:{step}"


def advance_task_id(conversation_id: str, turn_id: str, step: int, segment: int) -> str:
    return f"advance:{conversation_id}:{turn_id}:{step}:{segment}"


def position_of(task_id: str) -> Position | None:
    """The position a step or advance task id names; None for any other id."""
    kind, _, rest = task_id.partition(":")
    parts = rest.split(":")
    try:
        if kind == "step" and len(parts) == 3:
            return Position(parts[0], parts[1], int(parts[2]), -1)
        if kind == "advance" and len(parts) == 4:
            return Position(parts[0], parts[1], int(parts[2]), int(parts[3]))
    except ValueError:
        return None
    return None


class Dispatcher(Protocol):
    """Runs what the engine returns: Celery canvas on a fleet
    (:class:`orchestrator.dispatch.CeleryDispatcher`), or inline in one
    process (:class:`orchestrator.testing.InlineDispatcher`)."""

    def send(self, actions: Iterable[Action]) -> None:
        """Send (or run) each action."""

    def revoke(self, task_ids: list[str]) -> None:
        """Drop these tasks (tool calls of a cancelled job) if still waiting."""
