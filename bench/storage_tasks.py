"""Worker-side half of ``bench/storage.py``: its agent and tool.

Imported by the workers (and the bench's client) through
``CHORUS_MODULES=bench.storage_tasks``. It registers the tool
``bench_fetch`` (returns ``CHORUS_BENCH_STORAGE_KB`` KB of text that does
not compress, the same for the same ``n``) and the agent ``bench-storage``,
whose scripted model calls ``bench_fetch`` once a step for
``CHORUS_BENCH_STORAGE_STEPS`` steps, then answers with how many results it
was shown. Both variables are read at import; the bench sets them in its
own environment and the workers'.
"""

from __future__ import annotations

import os
import random
import string
from typing import Any

from orchestrator import Agent, tool
from orchestrator.llm.scripted import Reply, call, register_script, scripted_model

AGENT = "bench-storage"
KB = int(os.environ.get("CHORUS_BENCH_STORAGE_KB", "20"))
STEPS = int(os.environ.get("CHORUS_BENCH_STORAGE_STEPS", "5"))
_ALPHABET = string.ascii_letters + string.digits + " "


@tool
def bench_fetch(n: int) -> str:
    """A page of ``KB`` KB of random text (random: Postgres cannot compress it)."""
    rng = random.Random(n)
    return "".join(rng.choices(_ALPHABET, k=KB * 1000))


def _answer(messages: list[dict[str, Any]]) -> Reply:
    return Reply.say(f"read {sum(1 for m in messages if m.get('role') == 'tool')} pages")


register_script(AGENT, [Reply.call(call("bench_fetch", n=i)) for i in range(STEPS)] + [_answer])
Agent(AGENT, scripted_model(AGENT), system="Benchmark: reads pages.", tools=[bench_fetch])
