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
  :func:`cpu_key` after the task is done (outside what it measures);
- with ``BENCH_HISTORY_PROFILE=<dir>`` and ``BENCH_HISTORY_PROFILE_STEPS=0,50``:
  cProfile (per-thread CPU) around the ``chorus.step`` tasks of those steps,
  written when the worker shuts down to ``<dir>/step-<n>.pstats``.
"""

from __future__ import annotations

import cProfile
import json
import os
import threading
import time
from typing import Any

import redis
from celery.signals import task_postrun, task_prerun, worker_shutdown

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


_PROFILE_DIR = os.environ.get("BENCH_HISTORY_PROFILE")
_PROFILE_STEPS = {int(s) for s in os.environ.get("BENCH_HISTORY_PROFILE_STEPS", "").split(",") if s}
_profiles: dict[int, list[cProfile.Profile]] = {}


def _profiled_step(task_id: str | None) -> int | None:
    kind, _, rest = str(task_id).partition(":")
    if not _PROFILE_DIR or kind != "step" or not os.path.exists(f"{_PROFILE_DIR}/on"):
        return None  # the bench creates <dir>/on once its warm-up is over
    step = int(rest.rsplit(":", 1)[1])
    return step if step in _PROFILE_STEPS else None


def _prerun(task_id: str | None = None, **_: Any) -> None:
    step = _profiled_step(task_id)
    if step is not None:
        _local.profile = cProfile.Profile(time.thread_time)
        with _client_lock:
            _profiles.setdefault(step, []).append(_local.profile)
        _local.profile.enable()
    _local.began = (time.time(), time.thread_time(), time.process_time(), task_id)


def _postrun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    thread_cpu, process_cpu = time.thread_time(), time.process_time()
    profile = getattr(_local, "profile", None)
    if profile is not None:
        profile.disable()
        _local.profile = None
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


def _dump_profiles(**_: Any) -> None:
    import pstats

    with _client_lock:
        taken = {step: list(profiles) for step, profiles in _profiles.items()}
    for step, profiles in taken.items():
        stats = pstats.Stats(profiles[0])
        for profile in profiles[1:]:
            stats.add(profile)
        stats.dump_stats(os.path.join(str(_PROFILE_DIR), f"step-{step}.pstats"))


if _PROFILE_DIR:
    worker_shutdown.connect(_dump_profiles, weak=False)
