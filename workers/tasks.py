"""Task entry points: thin shells that call the engine and dispatch what it returns."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import Celery, Task
from celery.exceptions import Retry

from orchestrator import engine, tracing
from orchestrator.dispatch import dispatch
from orchestrator.engine.actions import Action
from orchestrator.engine.checkpoint import run_checkpoint
from orchestrator.engine.step import new_lease_owner
from orchestrator.engine.task_failures import describe, fail_at, fail_call, is_transient
from orchestrator.logs import log_context
from orchestrator.runtime import Runtime

log = logging.getLogger(__name__)

#: Retries of a task that lost its database or Redis connection.
MAX_TRANSIENT_RETRIES = 5


def _backoff(retries: int) -> float:
    """1, 2, 4, 8, 16 s: about half a minute for a restart to finish."""
    return float(2**retries)


def run_guarded(
    app: Celery,
    task: Task,
    run: Callable[[], list[Action]],
    fail: Callable[[str], list[Action]],
    handed_on: Callable[[], dict[str, Any]] | None = None,
) -> None:
    """Run the engine and dispatch what it returns. A lost connection is
    retried with backoff (the engine is idempotent), the retry's keyword
    arguments updated with what ``handed_on`` returns; any other exception fails the
    turn through ``fail`` (with the error) instead of leaving it running
    for the sweeper to send the same failing work again."""
    try:
        dispatch(app, run())
    except Retry:
        raise
    except Exception as exc:
        if is_transient(exc):
            log.warning("transient failure, retry %d", task.request.retries + 1, exc_info=True)
            raise task.retry(
                kwargs={**(task.request.kwargs or {}), **(handed_on() if handed_on else {})},
                exc=exc,
                countdown=_backoff(task.request.retries),
                max_retries=MAX_TRANSIENT_RETRIES,
            ) from exc
        log.exception("task failed; failing the turn")
        dispatch(app, fail(describe(exc)))


def register_tasks(app: Celery, rt: Runtime) -> None:
    """Define ``chorus.step``, ``chorus.tool``, ``chorus.advance``, ``chorus.dequeue``,
    ``chorus.deadline``, ``chorus.checkpoint`` and ``chorus.sweep``.

    Each runs in a fresh log context, so its log lines carry the ids of the
    conversation and turn it serves.
    """

    @app.task(name="chorus.step", bind=True)
    def step(
        self: Task,
        conversation_id: str,
        turn_id: str,
        step: int,
        previous_owner: str | None = None,
    ) -> None:
        with log_context(conversation_id=conversation_id, turn_id=turn_id, step=step):
            # set by this task's own retry only (anything else, from a hostile message, is ignored)
            owner = new_lease_owner(previous_owner)
            run_guarded(
                app,
                self,
                lambda: engine.run_step(rt, conversation_id, turn_id, step, owner),
                lambda error: fail_at(
                    rt, conversation_id, turn_id, step, -1, f"step {step} failed: {error}"
                ),
                # a lost database leaves the lease held: the retry takes it over
                handed_on=lambda: {"previous_owner": owner.holder},
            )

    @app.task(name="chorus.tool", bind=True)
    def tool(self: Task, call_id: str, subagent: bool = False) -> None:
        with log_context(tool_call_id=call_id):
            run_guarded(
                app,
                self,
                lambda: engine.run_tool(rt, call_id, self.request.id, subagent),
                lambda error: fail_call(rt, call_id, error),
            )

    @app.task(name="chorus.advance", bind=True)
    def advance(self: Task, conversation_id: str, turn_id: str, step: int, segment: int) -> None:
        with (
            log_context(conversation_id=conversation_id, turn_id=turn_id, step=step),
            tracing.advance(conversation_id, turn_id, step, segment),
        ):
            run_guarded(
                app,
                self,
                lambda: engine.advance(rt, conversation_id, turn_id, step, segment),
                lambda error: fail_at(
                    rt,
                    conversation_id,
                    turn_id,
                    step,
                    segment,
                    f"advancing step {step} failed: {error}",
                ),
            )

    @app.task(name="chorus.dequeue")
    def dequeue(conversation_id: str) -> None:
        with log_context(conversation_id=conversation_id):
            dispatch(app, engine.dequeue(rt, conversation_id))

    @app.task(name="chorus.deadline")
    def deadline(job_id: str) -> None:
        with log_context(turn_id=job_id):
            dispatch(app, engine.deadline(rt, job_id))

    @app.task(name="chorus.checkpoint")
    def checkpoint(conversation_id: str) -> None:
        with log_context(conversation_id=conversation_id):
            dispatch(app, run_checkpoint(rt, conversation_id))

    @app.task(name="chorus.sweep")
    def sweep() -> int:
        with log_context():
            actions = engine.sweep(rt)
            dispatch(app, actions)
            return len(actions)
