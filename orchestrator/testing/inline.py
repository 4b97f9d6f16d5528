"""The inline dispatcher: the engine's actions run in this process, in order.

What the Celery canvas does on a fleet (:mod:`orchestrator.dispatch`),
done in one thread: a step, a tool call, an advance, a dequeue, a
checkpoint and a deadline call the same engine functions as the
``chorus.*`` tasks (:mod:`workers.tasks`), and a failure is handled as
they handle it (a lost connection retried with backoff, any other
exception failing the turn at its position).

A segment's calls are queued one by one, as a chord's parts are, and its
``chorus.advance`` is queued once every part has returned (a chain is a
chord of one). Work with a countdown is ordered by when it is due: what
is due runs first, in the order it was sent; the dispatcher sleeps only
when nothing else is left to run. A job's wall-time ``Deadline`` is a
timer, not work: :meth:`InlineDispatcher.run` does not wait for it (it
runs if it falls due while other work is still queued).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from orchestrator import engine
from orchestrator.engine.actions import (
    Action,
    Deadline,
    Dequeue,
    Revoke,
    RunAdvance,
    RunSegment,
    RunStep,
    TakeCheckpoint,
    ToolTask,
)
from orchestrator.engine.checkpoint import run_checkpoint
from orchestrator.engine.step import new_lease_owner
from orchestrator.engine.subagents import is_subagent_call
from orchestrator.engine.task_failures import describe, fail_at, fail_call, is_transient
from orchestrator.runtime import Runtime

log = logging.getLogger(__name__)

#: Retries of work that lost its database or Redis connection (as the tasks').
MAX_TRANSIENT_RETRIES = 5


@dataclass
class _Chord:
    """A segment's parts still out; its advance is queued when none are."""

    segment: RunSegment
    left: int


@dataclass(frozen=True)
class _Part:
    """One tool call of a segment (a ``chorus.tool`` task)."""

    call: ToolTask
    chord: _Chord


Work = Action | _Part


@dataclass(order=True)
class _Queued:
    due: float
    seq: int
    work: Work = field(compare=False)
    retries: int = field(default=0, compare=False)


class InlineDispatcher:
    """Runs the engine's actions in this process until none are left.

    Args:
        rt: The runtime the engine runs with (store, Redis, model client).
        autorun: Run everything sent at once (``send`` returns when the
            work it started is done); when False, work waits for
            :meth:`run` or :meth:`run_next`.

    Attributes:
        ran: Every action run, in order (a tool call as its ``ToolTask``).
    """

    def __init__(self, rt: Runtime, autorun: bool = True) -> None:
        self.rt = rt
        self.autorun = autorun
        self.ran: list[Action | ToolTask] = []
        self._queue: list[_Queued] = []
        self._seq = itertools.count()
        self._running = False

    def send(self, actions: Iterable[Action]) -> None:
        """Queue each action; run the queue unless held (or already running)."""
        for action in actions:
            self._queue_action(action)
        if self.autorun and not self._running:
            self.run()

    def revoke(self, task_ids: list[str]) -> None:
        """Drop queued tool calls with these ids (a revoked task never runs)."""
        ids = set(task_ids)
        kept = [
            q for q in self._queue if not (isinstance(q.work, _Part) and q.work.call.call_id in ids)
        ]
        if len(kept) != len(self._queue):
            self._queue = kept
            heapq.heapify(self._queue)

    @property
    def pending(self) -> list[Action | ToolTask]:
        """What is queued, in the order it would run."""
        return [_shown(q.work) for q in sorted(self._queue)]

    def run(self) -> int:
        """Run queued work, and the work it leads to, until none is left
        (timers aside); returns how many items ran."""
        count = 0
        while self.run_next() is not None:
            count += 1
        return count

    def run_next(self) -> Action | ToolTask | None:
        """Run the next item due, sleeping until it is if it has a
        countdown; None when nothing but timers is left."""
        if not self._queue:
            return None
        if self._queue[0].due > time.monotonic() and all(
            isinstance(q.work, Deadline) for q in self._queue
        ):
            return None  # only timers, none due: nothing is left to do
        item = heapq.heappop(self._queue)
        wait = item.due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self._running = True
        try:
            self._run(item)
        finally:
            self._running = False
        shown = _shown(item.work)
        self.ran.append(shown)
        return shown

    def _queue_action(self, action: Action, countdown: float = 0.0) -> None:
        if isinstance(action, Revoke):
            self.revoke(list(action.task_ids))
        elif isinstance(action, RunSegment):
            chord = _Chord(action, len(action.calls))
            if not action.calls:
                self._queue_work(_advance_of(action))
            for call in action.calls:
                self._queue_work(_Part(call, chord), max(action.countdown, countdown))
        else:
            delay = (
                action.countdown if isinstance(action, RunStep | TakeCheckpoint | Deadline) else 0
            )
            self._queue_work(action, max(delay, countdown))

    def _queue_work(self, work: Work, countdown: float = 0.0, retries: int = 0) -> None:
        due = time.monotonic() + countdown
        heapq.heappush(self._queue, _Queued(due, next(self._seq), work, retries))

    def _run(self, item: _Queued) -> None:
        run, fail = self._task(item.work)
        try:
            actions = run()
        except Exception as exc:
            if is_transient(exc) and item.retries < MAX_TRANSIENT_RETRIES:
                log.warning("transient failure, retry %d", item.retries + 1, exc_info=True)
                self._queue_work(item.work, float(2**item.retries), item.retries + 1)
                return
            log.exception("%s failed; failing the turn", _shown(item.work))
            actions = fail(describe(exc))
        finally:
            if isinstance(item.work, _Part):
                self._part_returned(item.work.chord)
        for action in actions:
            self._queue_action(action)

    def _part_returned(self, chord: _Chord) -> None:
        chord.left -= 1
        if chord.left == 0:
            self._queue_work(_advance_of(chord.segment))

    def _task(self, work: Work) -> tuple[Callable[[], list[Action]], Callable[[str], list[Action]]]:
        """What the ``chorus.*`` task of ``work`` runs, and how it fails."""
        rt = self.rt
        if isinstance(work, RunStep):
            c, t, s = work.conversation_id, work.turn_id, work.step
            return (
                lambda: engine.run_step(rt, c, t, s, new_lease_owner()),
                lambda error: fail_at(rt, c, t, s, -1, f"step {s} failed: {error}"),
            )
        if isinstance(work, _Part):
            call = work.call
            return (
                lambda: engine.run_tool(
                    rt, call.call_id, call.call_id, is_subagent_call(call.tool)
                ),
                lambda error: fail_call(rt, call.call_id, error),
            )
        if isinstance(work, RunAdvance):
            c, t, s, g = work.conversation_id, work.turn_id, work.step, work.segment
            return (
                lambda: engine.advance(rt, c, t, s, g),
                lambda error: fail_at(rt, c, t, s, g, f"advancing step {s} failed: {error}"),
            )
        if isinstance(work, Dequeue):
            return lambda: engine.dequeue(rt, work.conversation_id), _unhandled
        if isinstance(work, TakeCheckpoint):
            return lambda: run_checkpoint(rt, work.conversation_id), _unhandled
        if isinstance(work, Deadline):
            return lambda: engine.deadline(rt, work.job_id), _unhandled
        raise TypeError(f"not an action the inline dispatcher runs: {work!r}")


def _unhandled(error: str) -> list[Action]:
    """Tasks that fail no turn when they fail (``chorus.dequeue`` and the
    like): the error is logged, as a worker logs it."""
    return []


def _advance_of(segment: RunSegment) -> RunAdvance:
    return RunAdvance(
        segment.conversation_id, segment.turn_id, segment.step, segment.segment, segment.priority
    )


def _shown(work: Work) -> Action | ToolTask:
    return work.call if isinstance(work, _Part) else work
