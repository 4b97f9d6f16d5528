"""Task entry points: thin shells that call the engine and dispatch what it returns."""

from __future__ import annotations

from celery import Celery, Task

from orchestrator import engine
from orchestrator.dispatch import dispatch
from orchestrator.engine.step import new_lease_owner
from orchestrator.runtime import Runtime


def register_tasks(app: Celery, rt: Runtime) -> None:
    """Define ``chorus.step``, ``chorus.tool``, ``chorus.advance`` and ``chorus.sweep``."""

    @app.task(name="chorus.step", bind=True)
    def step(self: Task, conversation_id: str, turn_id: str, step: int) -> None:
        dispatch(app, engine.run_step(rt, conversation_id, turn_id, step, new_lease_owner()))

    @app.task(name="chorus.tool", bind=True)
    def tool(self: Task, call_id: str) -> None:
        engine.run_tool(rt, call_id, self.request.id)

    @app.task(name="chorus.advance")
    def advance(conversation_id: str, turn_id: str, step: int, segment: int) -> None:
        dispatch(app, engine.advance(rt, conversation_id, turn_id, step, segment))

    @app.task(name="chorus.sweep")
    def sweep() -> int:
        actions = engine.sweep(rt)
        dispatch(app, actions)
        return len(actions)
