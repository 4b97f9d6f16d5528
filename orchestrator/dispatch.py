"""Turn engine actions into Celery canvas, by task name (no task imports)."""

from __future__ import annotations

from collections.abc import Iterable

from celery import Celery, Signature, chain, chord, group
from celery.backends.redis import RedisBackend

from orchestrator.celery_conf import broker_priority
from orchestrator.engine.actions import (
    Action,
    Deadline,
    Dequeue,
    Revoke,
    RunAdvance,
    RunSegment,
    RunStep,
    TakeCheckpoint,
    advance_task_id,
    step_task_id,
)
from orchestrator.engine.subagents import is_subagent_call


class CeleryDispatcher:
    """Sends actions to the fleet as Celery canvas (:func:`dispatch`)."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def send(self, actions: Iterable[Action]) -> None:
        dispatch(self.app, actions)

    def revoke(self, task_ids: list[str]) -> None:
        self.app.control.revoke(task_ids)


def _short(value: str) -> str:
    return value[:8]


def dispatch(app: Celery, actions: Iterable[Action]) -> None:
    """Send each action: a step, or a segment as a chain (one call) or a
    chord over a group (several calls) ending in ``chorus.advance``.

    The tasks sent here keep no Celery result (results live in Postgres),
    so Redis holds none of their outcomes for a day: every task is sent
    with ``ignore_result``, chord parts too when the result backend joins a
    chord without its parts' stored results (:func:`_joins_without_results`).

    Each task's id names the cursor position it serves (a tool task's id
    is its call's id), so every copy of one position has the same id and
    the sweeper can see whether one is still waiting in the broker.

    Every task of a job is sent with the job's priority (each action
    carries it), so a worker takes a higher-priority job's work first.
    """
    for action in actions:
        if isinstance(action, RunStep):
            app.signature(
                "chorus.step",
                args=(action.conversation_id, action.turn_id, action.step),
                queue="llm",
                ignore_result=True,
                priority=broker_priority(action.priority),
                task_id=step_task_id(action.conversation_id, action.turn_id, action.step),
                argsrepr=f"conv={_short(action.conversation_id)} turn={_short(action.turn_id)} "
                f"step={action.step}",
            ).apply_async(countdown=_held(app, action.countdown))
        elif isinstance(action, RunSegment):
            _send_segment(app, action)
        elif isinstance(action, RunAdvance):
            _advance(app, action).apply_async()
        elif isinstance(action, TakeCheckpoint):
            app.signature(
                "chorus.checkpoint",
                args=(action.conversation_id,),
                queue="llm",
                ignore_result=True,
                priority=broker_priority(action.priority),
                argsrepr=f"conv={_short(action.conversation_id)}",
            ).apply_async(countdown=_held(app, action.countdown))
        elif isinstance(action, Revoke):
            if action.task_ids:
                app.control.revoke(list(action.task_ids))
        elif isinstance(action, Deadline):
            app.signature(
                "chorus.deadline",
                args=(action.job_id,),
                queue="control",
                ignore_result=True,
                priority=broker_priority(action.priority),
                argsrepr=f"job={_short(action.job_id)}",
            ).apply_async(countdown=_held(app, action.countdown))
        elif isinstance(action, Dequeue):
            app.signature(
                "chorus.dequeue",
                args=(action.conversation_id,),
                queue="control",
                ignore_result=True,
                argsrepr=f"conv={_short(action.conversation_id)}",
            ).apply_async()


def _held(app: Celery, countdown: float) -> float | None:
    """A countdown a worker may hold its task for: below half the broker's
    visibility timeout, since Redis hands a task held longer to another
    worker again (every hour by default, for as long as it is held). A task
    that arrives early sends itself again for the time left: a deferred
    step reads when it is due (``due_at``), a deadline the job's budget, a
    checkpoint its rate limit."""
    if not countdown:
        return None
    timeout = app.conf.broker_transport_options.get("visibility_timeout")
    return min(countdown, timeout / 2) if timeout else countdown


def _advance(app: Celery, seg: RunSegment | RunAdvance) -> Signature:
    return app.signature(
        "chorus.advance",
        args=(seg.conversation_id, seg.turn_id, seg.step, seg.segment),
        queue="control",
        immutable=True,
        ignore_result=True,
        priority=broker_priority(seg.priority),
        task_id=advance_task_id(seg.conversation_id, seg.turn_id, seg.step, seg.segment),
        argsrepr=f"conv={_short(seg.conversation_id)} step={seg.step} segment={seg.segment}",
    )


def _send_segment(app: Celery, seg: RunSegment) -> None:
    where = f"conv={_short(seg.conversation_id)} step={seg.step}"
    advance = _advance(app, seg)
    ignore_result = _joins_without_results(app)
    tools = [
        app.signature(
            "chorus.tool",
            args=(call.call_id,),
            # A subagent call's task skips the claim of a tool run.
            kwargs={"subagent": True} if is_subagent_call(call.tool) else None,
            queue=call.queue,
            immutable=True,
            ignore_result=ignore_result,
            priority=broker_priority(seg.priority),
            # The call's id is the task's id, so cancelling a turn can revoke
            # tool tasks still waiting in a queue.
            task_id=call.call_id,
            argsrepr=f"tool={call.tool} call={_short(call.call_id)} {where}",
        )
        for call in seg.calls
    ]
    if not tools:
        advance.apply_async()
    elif len(tools) == 1:
        # A chain needs no stored result: the worker sends the next link.
        # (A countdown: a call a policy deferred, sent again alone.)
        chain(tools[0].set(ignore_result=True), advance).apply_async(
            countdown=_held(app, seg.countdown)
        )
    else:
        # The header as a generator: given a list, the Redis backend keeps a
        # result object of every part, subscribed to its result channel, in
        # the sending worker for good (nothing in a worker drains those
        # channels, and with ``ignore_result`` no result is ever published):
        # ~4 KB and a Redis subscription per call. A generator's parts are
        # only watched weakly, and unsubscribed once sent.
        chord(group(tool for tool in tools), advance).apply_async()


def _joins_without_results(app: Celery) -> bool:
    """Does the result backend join a chord without its parts' stored
    results? Redis's does (a backend that keeps its chord join): each
    part's outcome goes into the chord's own list as it is counted, and the
    body is sent from that list. So the parts store none (a Redis SET and
    PUBLISH each, and a key kept for ``result_expires``). Other backends
    join by reading the parts' results, which then must be stored.

    A part that stores no result is not acknowledged by a prefork worker
    whose child died after it ran: it runs again, finds its call finished
    and leaves (the chord counts each part once)."""
    backend = type(app.backend)
    return backend.on_chord_part_return is RedisBackend.on_chord_part_return
