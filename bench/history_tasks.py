"""Worker-side half of ``bench/history.py``.

Imported by the ``chorus worker`` the bench starts
(``CHORUS_MODULES=bench.history_tasks``):

- a tool ``bench_blob`` that returns ``BLOB_BYTES`` of text;
- a scripted model that calls it once per step until the conversation holds
  as many tool steps as the job's input asks (``steps=N``), then answers.
  Its replies state their usage, so the scripted provider does not count
  the prompt's words (a cost of the fake model that grows with the
  history, not one of Chorus);
- the agent ``bench-history`` tying them together;
- per-task CPU accounting: around every task (``task_prerun`` →
  ``task_postrun``) the CPU time of the thread running it and of the whole
  process, pushed with the task's id, name and start time to the Redis list
  :func:`cpu_key` after the task is done (outside what it measures).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import redis
from celery.signals import task_postrun, task_prerun

from orchestrator import Agent, tool
from orchestrator.llm.scripted import Reply, call, register_script, scripted_model

#: Name of the agent and of its script.
AGENT = "bench-history"
#: Bytes of text each tool call returns.
BLOB_BYTES = 20_000
#: The longest turn the bench may ask for (AgentSpec caps max_steps at 1000).
MAX_STEPS = 200

_WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit")


@tool
def bench_blob(i: int) -> str:
    """Return 20 KB of text.

    Args:
        i: the step number, quoted at the start of the text.
    """
    head = f"blob {i}: "
    words = " ".join(_WORDS[(i + k) % len(_WORDS)] for k in range(BLOB_BYTES // 5))
    return (head + words)[:BLOB_BYTES]


def steps_asked(messages: list[dict[str, Any]]) -> int:
    """The ``N`` of the job's ``steps=N`` input (its first user message)."""
    first = next(m for m in messages if m.get("role") == "user")
    return int(str(first["content"]).partition("steps=")[2])


def _reply(messages: list[dict[str, Any]]) -> Reply:
    done = sum(1 for m in messages if m.get("role") == "assistant")
    if done < steps_asked(messages):
        return Reply(tool_calls=[call("bench_blob", i=done)], input_tokens=100, output_tokens=10)
    return Reply(text=f"done after {done} steps", input_tokens=100, output_tokens=5)


register_script(AGENT, [_reply] * (MAX_STEPS + 1))

history_agent = Agent(
    AGENT,
    model=scripted_model(AGENT),
    system="Benchmark agent: call the blob tool as told.",
    tools=[bench_blob],
    max_steps=MAX_STEPS + 1,
)


# --- per-task CPU ------------------------------------------------------------


def cpu_key(prefix: str) -> str:
    """The Redis list of per-task CPU records (JSON objects)."""
    return f"{prefix}:bench-history-cpu"


_local = threading.local()
_client_lock = threading.Lock()
_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _client
    with _client_lock:
        if _client is None:
            _client = redis.Redis.from_url(os.environ["CHORUS_REDIS_URL"])
        return _client


def _prerun(task_id: str | None = None, **_: Any) -> None:
    _local.began = (time.time(), time.thread_time(), time.process_time(), task_id)


def _postrun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    thread_cpu, process_cpu = time.thread_time(), time.process_time()
    began = getattr(_local, "began", None)
    if began is None or began[3] != task_id:
        return
    record = {
        "task_id": task_id,
        "name": getattr(task, "name", ""),
        "start": began[0],
        "thread_cpu": thread_cpu - began[1],
        "process_cpu": process_cpu - began[2],
    }
    _redis().rpush(cpu_key(os.environ["CHORUS_REDIS_PREFIX"]), json.dumps(record))


task_prerun.connect(_prerun, weak=False)
task_postrun.connect(_postrun, weak=False)
