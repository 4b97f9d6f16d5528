"""What the engine asks the dispatcher to run next."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunStep:
    """Call the model for ``step`` of the turn (task ``chorus.step``)."""

    conversation_id: str
    turn_id: str
    step: int
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
    a lone parallelizable call) as a chain.
    """

    conversation_id: str
    turn_id: str
    step: int
    segment: int
    calls: tuple[ToolTask, ...]


@dataclass(frozen=True)
class RunAdvance:
    """Try to advance a segment now (task ``chorus.advance``): a subagent's
    end answers its parent's call outside any chord."""

    conversation_id: str
    turn_id: str
    step: int
    segment: int


@dataclass(frozen=True)
class Dequeue:
    """Start the next queued message of a conversation if it is idle
    (task ``chorus.dequeue``)."""

    conversation_id: str


@dataclass(frozen=True)
class Revoke:
    """Revoke these tasks (tool calls of a stopped tree; their ids are the call ids)."""

    task_ids: tuple[str, ...]


@dataclass(frozen=True)
class Checkpoint:
    """Summarize a conversation in the background (task ``chorus.checkpoint``)."""

    conversation_id: str
    countdown: float = 0.0  # seconds to wait first (over a rate limit)


@dataclass(frozen=True)
class Deadline:
    """Look at the job's wall-time budget after ``countdown`` seconds and
    stop it if spent (task ``chorus.deadline``)."""

    job_id: str
    countdown: float


Action = RunStep | RunSegment | RunAdvance | Dequeue | Revoke | Checkpoint | Deadline
