"""Tool calls run in helper threads that are kept between calls."""

from __future__ import annotations

import contextvars
import threading
import time

import pytest

from orchestrator import tool
from orchestrator.errors import ToolExecutionError
from orchestrator.tools import ToolContext, ToolStopped

CTX = ToolContext(conversation_id="c", root_id="c", turn_id="t", tool_request_id="r")
marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="unset")


local = threading.local()


@tool(name="threads_probe", timeout=5)
def probe() -> dict[str, object]:
    """Where it ran: its thread's count of calls, and the context variable it found."""
    local.calls = getattr(local, "calls", 0) + 1
    found = marker.get()
    marker.set("set by an earlier call")
    return {"thread": threading.get_ident(), "calls": local.calls, "marker": found}


@tool(name="threads_sleeper", timeout=0.3)
def sleeper(seconds: float) -> str:
    """Sleeps."""
    time.sleep(seconds)
    return "woke"


def test_a_finished_helper_runs_the_next_call_with_a_fresh_context() -> None:
    first = probe.invoke({}, CTX)
    second = probe.invoke({}, CTX)
    # the same helper thread (its thread-local state persists), not the caller's
    assert first["thread"] != threading.get_ident()
    assert second["calls"] == first["calls"] + 1
    # and no context variable is left behind
    assert first["marker"] == second["marker"] == "unset"


def test_a_timed_out_call_keeps_its_helper_and_frees_the_caller() -> None:
    began = time.monotonic()
    with pytest.raises(ToolExecutionError, match=r"timed out after 0\.3s"):
        sleeper.invoke({"seconds": 1.5}, CTX)
    assert time.monotonic() - began < 1.0  # the caller left at the timeout
    # the next call runs at once, in another helper (the first is still asleep)
    assert sleeper.invoke({"seconds": 0}, CTX) == "woke"


@tool(name="threads_napper", timeout=30)
def napper(seconds: float) -> str:
    """Sleeps, with a long timeout."""
    time.sleep(seconds)
    return "woke"


def test_a_stopped_call_leaves_before_its_tool_returns() -> None:
    began = time.monotonic()
    with pytest.raises(ToolStopped):
        napper.invoke({"seconds": 3}, CTX, should_stop=lambda: True)
    assert time.monotonic() - began < 2  # at the first look at the stop flag (0.5 s)
