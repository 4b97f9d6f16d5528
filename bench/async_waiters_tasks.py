"""Worker-side half of ``bench/async_waiters.py``: the agent its jobs run.

Imported by the workers only (``CHORUS_MODULES=bench.async_waiters_tasks``):
the bench's client imports no agent module and validates the name against
what the workers published. ``bench-waited`` calls ``bench_nap`` (sleeps
``CHORUS_BENCH_NAP`` seconds, default 3) and answers ``done <input>``, so
the jobs are still running while the waiters gather.
"""

from __future__ import annotations

import os
import time
from typing import Any

from orchestrator import Agent, tool
from orchestrator.llm.scripted import Reply, call, register_script, scripted_model

NAP = float(os.environ.get("CHORUS_BENCH_NAP", "3"))


@tool
def bench_nap(seconds: float) -> str:
    """Sleep, standing for a slow tool."""
    time.sleep(seconds)
    return "rested"


def _answer(messages: list[dict[str, Any]]) -> Reply:
    said = [m["content"] for m in messages if m["role"] == "user"][-1]
    return Reply.say(f"done {said}")


register_script("bench-waited", [Reply.call(call("bench_nap", seconds=NAP)), _answer])
Agent("bench-waited", scripted_model("bench-waited"), tools=[bench_nap])
