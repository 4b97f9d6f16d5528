"""The engine: decides what runs next and returns it as a value.

Each entry point (:func:`start_turn`, :func:`run_step`, :func:`run_tool`,
:func:`advance`, :func:`sweep`) does its database work and returns a list
of :mod:`~orchestrator.engine.actions` for the caller to dispatch. The
Celery tasks are thin shells around these functions.

:func:`run_step`, :func:`run_tool`, :func:`dequeue` and :func:`start_turn`
are resolved lazily (:mod:`orchestrator.lazy`): a client that imports one
engine module does not load the step, its tool declarations and their
JSON-schema validation with it. :func:`advance`, :func:`cancel` and
:func:`sweep` are imported here: each shares its name with its module,
which importing the module would bind on this package in its place.
"""

from typing import TYPE_CHECKING

from orchestrator.engine.actions import Action, Dequeue, RunAdvance, RunSegment, RunStep, ToolTask
from orchestrator.engine.advance import advance
from orchestrator.engine.cancel import cancel, deadline
from orchestrator.engine.sweep import sweep
from orchestrator.lazy import lazy_exports

_LAZY = {
    "dequeue": "orchestrator.engine.inbox",
    "run_step": "orchestrator.engine.step",
    "run_tool": "orchestrator.engine.toolrun",
    "start_turn": "orchestrator.engine.turns",
}

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

if TYPE_CHECKING:
    from orchestrator.engine.inbox import dequeue
    from orchestrator.engine.step import run_step
    from orchestrator.engine.toolrun import run_tool
    from orchestrator.engine.turns import start_turn
else:
    __getattr__, __dir__ = lazy_exports(__name__, _LAZY)
