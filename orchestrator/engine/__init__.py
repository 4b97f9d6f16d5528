"""The engine: decides what runs next and returns it as a value.

Each entry point (:func:`start_turn`, :func:`run_step`, :func:`run_tool`,
:func:`advance`, :func:`sweep`) does its database work and returns a list
of :mod:`~orchestrator.engine.actions` for the caller to dispatch. The
Celery tasks are thin shells around these functions.
"""

from orchestrator.engine.actions import Action, Dequeue, RunAdvance, RunSegment, RunStep, ToolTask
from orchestrator.engine.advance import advance
from orchestrator.engine.cancel import cancel, deadline
from orchestrator.engine.inbox import dequeue
from orchestrator.engine.step import run_step
from orchestrator.engine.sweep import sweep
from orchestrator.engine.toolrun import run_tool
from orchestrator.engine.turns import start_turn

__all__ = [
    "Action",
    "Dequeue",
    "RunAdvance",
    "RunSegment",
    "RunStep",
    "ToolTask",
    "advance",
    "cancel",
    "deadline",
    "dequeue",
    "run_step",
    "run_tool",
    "start_turn",
    "sweep",
]
