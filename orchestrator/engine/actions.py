"""What the engine asks the dispatcher to run next."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunStep:
    """Call the model for ``step`` of the turn (task ``chorus.step``)."""

    conversation_id: str
    turn_id: str
    step: int


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


Action = RunStep | RunSegment
