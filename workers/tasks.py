"""Task entry points: thin shells that call the engine and dispatch what it returns."""

from __future__ import annotations

from celery import Celery, Task

from orchestrator import engine
from orchestrator.dispatch import dispatch
from orchestrator.engine.checkpoint import take_checkpoint
from orchestrator.engine.step import new_lease_owner
from orchestrator.logs import log_context
from orchestrator.runtime import Runtime


def register_tasks(app: Celery, rt: Runtime) -> None:
    """Define ``chorus.step``, ``chorus.tool``, ``chorus.advance``, ``chorus.dequeue``,
    ``chorus.deadline``, ``chorus.checkpoint`` and ``chorus.sweep``.

    Each runs in a fresh log context, so its log lines carry the ids of the
    conversation and turn it serves.
    """

    @app.task(name="chorus.step")
    def step(conversation_id: str, turn_id: str, step: int) -> None:
        with log_context(conversation_id=conversation_id, turn_id=turn_id, step=step):
            owner = new_lease_owner()
            dispatch(app, engine.run_step(rt, conversation_id, turn_id, step, owner))

    @app.task(name="chorus.tool", bind=True)
    def tool(self: Task, call_id: str) -> None:
        with log_context(tool_call_id=call_id):
            dispatch(app, engine.run_tool(rt, call_id, self.request.id))

    @app.task(name="chorus.advance")
    def advance(conversation_id: str, turn_id: str, step: int, segment: int) -> None:
        with log_context(conversation_id=conversation_id, turn_id=turn_id, step=step):
            dispatch(app, engine.advance(rt, conversation_id, turn_id, step, segment))

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
            take_checkpoint(rt, conversation_id)

    @app.task(name="chorus.sweep")
    def sweep() -> int:
        with log_context():
            actions = engine.sweep(rt)
            dispatch(app, actions)
            return len(actions)
