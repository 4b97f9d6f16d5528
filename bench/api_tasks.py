"""Worker-side half of ``bench/api.py``: its agent and tool.

The agent ``bench-api`` calls ``bench_pause`` once (it sleeps
``CHORUS_BENCH_API_PAUSE`` seconds, default 1.0), then answers: a turn of
about a dozen events spread over that second, for followers to follow.
"""

from __future__ import annotations

import os
import time

from orchestrator import Agent, tool
from orchestrator.llm.scripted import Reply, call, register_script, scripted_model

AGENT = "bench-api"
PAUSE = float(os.environ.get("CHORUS_BENCH_API_PAUSE", "1.0"))


@tool
def bench_pause() -> str:
    """Sleep the pause, then say so."""
    time.sleep(PAUSE)
    return "paused"


register_script(AGENT, [Reply.call(call("bench_pause")), Reply.say("done")])
Agent(AGENT, scripted_model(AGENT), tools=[bench_pause])
