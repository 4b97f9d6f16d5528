"""Worker-side half of ``bench/step_overhead.py``.

Imported by both workers the bench starts:

- the Chorus worker, through ``CHORUS_MODULES=bench.step_overhead_tasks``:
  the no-op tool ``bench_noop`` and, when the bench runs a loopback model
  server (``BENCH_LLM_BASE``), the agent ``bench-loopback``
  (:mod:`bench.loopback_agent`); and a scripted model that calls the tool 4
  times per step for as many steps as the job input asks (``steps=N``),
  then answers, with the agent ``bench-step-overhead`` on it
  (``--model scripted``);
- the raw Celery worker, through ``celery -A bench.step_overhead_tasks``:
  the same canvas shape with no Chorus in it, ``bench.step`` →
  ``chord(group(4 x bench.tool), bench.advance)`` → ``bench.step`` …,
  on the same Celery configuration (:func:`orchestrator.celery_conf.celery_config`)
  under its own Redis prefix (``BENCH_RAW_PREFIX``); and the same canvas
  whose step makes the model call Chorus makes, through the same model
  client (:func:`orchestrator.llm.call.complete`, same model, messages and
  tools): ``bench.model_step`` → ``chord(group(tools), bench.model_advance)``
  (one call: ``chain(bench.tool, bench.model_advance)``, as Chorus sends it)
  → ``bench.model_step`` …, the history carried in the task arguments;
  ``bench/throughput.py``'s raw row runs it too.

``BENCH_PROFILE=<dir>`` makes a worker profile every task it runs with
cProfile (one profiler per pool thread, enabled between ``task_prerun`` and
``task_postrun``, once the file ``<dir>/on`` exists) and write
``<dir>/tasks-<pid>.pstats`` when it shuts down. ``BENCH_PROFILE_TIMER=cpu``
profiles per-thread CPU time instead of wall time. ``BENCH_TASK_CPU=<dir>``
counts, per task name, the tasks run, their thread's CPU time and its
context switches (from ``task_prerun`` to ``task_postrun``, once
``<dir>/on`` exists) into ``<dir>/taskcpu-<pid>.json`` at shutdown.
"""

from __future__ import annotations

import cProfile
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import redis
from celery import Celery, chain, chord, group
from celery.signals import (
    task_postrun,
    task_prerun,
    worker_process_shutdown,
    worker_shutdown,
)

from bench.loopback_agent import bench_noop
from orchestrator import Agent
from orchestrator.celery_conf import celery_config
from orchestrator.llm.call import complete, tool_to_openai
from orchestrator.llm.scripted import Reply, call, register_script, scripted_model
from orchestrator.settings import load_settings

#: Tool calls the model asks for in each step (all parallelizable: one chord).
TOOLS_PER_STEP = 4
#: Name of the Chorus agent and of its script.
AGENT = "bench-step-overhead"
#: The longest turn the agent allows (AgentSpec caps max_steps at 1000).
MAX_STEPS = 999

_STEPS_RE = re.compile(r"steps=(\d+)")


# --- Chorus side ----------------------------------------------------------


def _steps_asked(messages: list[dict[str, Any]]) -> int:
    for message in messages:
        if message.get("role") == "user":
            found = _STEPS_RE.search(str(message.get("content") or ""))
            if found:
                return int(found.group(1))
    return 1


def _reply(messages: list[dict[str, Any]]) -> Reply:
    """Call the tools until the job's ``steps=N`` steps are done, then answer."""
    done = sum(1 for m in messages if m.get("role") == "assistant")
    if done < _steps_asked(messages):
        return Reply.call(*(call("bench_noop", i=k) for k in range(TOOLS_PER_STEP)))
    return Reply.say(f"done after {done} steps")


register_script(AGENT, [_reply] * (MAX_STEPS + 1))

SYSTEM = "Benchmark agent: call the no-op tool as told."

bench_agent = Agent(
    AGENT,
    model=scripted_model(AGENT),
    system=SYSTEM,
    tools=[bench_noop],
    max_steps=MAX_STEPS + 1,
)


# --- raw Celery side ------------------------------------------------------


def done_key(prefix: str, run_id: str) -> str:
    """The Redis list a finished raw turn pushes to (the client BLPOPs it)."""
    return f"{prefix}:bench-done:{run_id}"


def _raw_app() -> Celery:
    prefix = os.environ.get("BENCH_RAW_PREFIX", "chorus-bench-raw")
    url = os.environ.get("CHORUS_REDIS_URL") or "redis://127.0.0.1:6379/0"
    settings = load_settings(redis_prefix=prefix, redis_url=url)
    raw = Celery("bench-raw", set_as_current=False)
    raw.conf.update(celery_config(settings))
    raw.conf.task_routes = {
        "bench.step": {"queue": "llm"},
        "bench.model_step": {"queue": "llm"},
        "bench.tool": {"queue": "tools"},
        "bench.advance": {"queue": "control"},
        "bench.model_advance": {"queue": "control"},
    }
    raw.conf.beat_schedule = {}
    return raw


app = _raw_app()
_redis_lock = threading.Lock()
_redis_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _redis_client
    with _redis_lock:
        if _redis_client is None:
            _redis_client = redis.Redis.from_url(app.conf.broker_url)
        return _redis_client


@app.task(name="bench.step", ignore_result=True, shared=False)
def raw_step(run_id: str, step: int, steps: int) -> None:
    """The raw "model step": a chord of no-op tools, or the end of the turn."""
    if step >= steps:
        prefix = app.conf.broker_transport_options["global_keyprefix"].rstrip(":")
        _redis().rpush(done_key(prefix, run_id), time.time())
        return
    tools = [raw_tool.si(k) for k in range(TOOLS_PER_STEP)]
    chord(group(tools), raw_advance.si(run_id, step, steps)).apply_async()


@app.task(name="bench.tool", shared=False)
def raw_tool(i: int) -> int:
    """A no-op tool."""
    return i


@app.task(name="bench.advance", ignore_result=True, shared=False)
def raw_advance(run_id: str, step: int, steps: int) -> None:
    """The chord callback: send the next step."""
    raw_step.apply_async((run_id, step + 1, steps))


# --- raw Celery with the model call -------------------------------------


@app.task(name="bench.model_step", ignore_result=True, shared=False)
def raw_model_step(
    run_id: str, model: str, settings: dict[str, Any], messages: list[dict[str, Any]]
) -> None:
    """The raw step with Chorus's model call: the same ``complete`` on the
    same model, then a chord of the tools it asked for (one call: a chain,
    as Chorus sends it), or the end of the turn."""
    reply = complete(model, messages, [tool_to_openai(bench_noop.spec)], settings)
    if not reply.tool_calls:
        prefix = app.conf.broker_transport_options["global_keyprefix"].rstrip(":")
        _redis().rpush(done_key(prefix, run_id), reply.text)
        return
    calls = [
        {
            "id": c.tool_request_id,
            "type": "function",
            "function": {"name": c.tool, "arguments": json.dumps(c.params)},
        }
        for c in reply.tool_calls
    ]
    messages = [
        *messages,
        {"role": "assistant", "content": reply.text or None, "tool_calls": calls},
    ]
    tools = [raw_tool.si(c.params.get("i", 0)) for c in reply.tool_calls]
    advance = raw_model_advance.s(run_id, model, settings, messages)
    if len(tools) == 1:  # as Chorus sends one call: a chain, no stored result
        chain(tools[0].set(ignore_result=True), advance).apply_async()
    else:
        chord(group(tools), advance).apply_async()


@app.task(name="bench.model_advance", ignore_result=True, shared=False)
def raw_model_advance(
    results: list[Any] | Any,
    run_id: str,
    model: str,
    settings: dict[str, Any],
    messages: list[dict[str, Any]],
) -> None:
    """The chord callback (or the chain's next link: one call's result):
    the tool results as tool messages, then the next step."""
    calls = messages[-1]["tool_calls"]
    if len(calls) == 1:  # a chain passed the one result as it is
        results = [results]
    tool_messages = [
        {
            "role": "tool",
            "tool_call_id": c["id"],
            "name": c["function"]["name"],
            "content": json.dumps(r),
        }
        for c, r in zip(calls, results, strict=True)
    ]
    raw_model_step.apply_async((run_id, model, settings, [*messages, *tool_messages]))


def first_messages(text: str) -> list[dict[str, Any]]:
    """The first request of a turn, as the Chorus agents send it."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


# --- optional per-task profiling -----------------------------------------

_PROFILE_DIR = os.environ.get("BENCH_PROFILE")
_PROFILE_CPU = os.environ.get("BENCH_PROFILE_TIMER") == "cpu"
_profiles: list[cProfile.Profile] = []
_local = threading.local()


def _prerun(**_: Any) -> None:
    # the bench creates <dir>/on once its warm-up is over
    if _PROFILE_DIR is None or not os.path.exists(os.path.join(_PROFILE_DIR, "on")):
        return
    prof = getattr(_local, "profile", None)
    if prof is None:
        prof = cProfile.Profile(time.thread_time) if _PROFILE_CPU else cProfile.Profile()
        _local.profile = prof
        with _redis_lock:
            _profiles.append(prof)
    prof.enable()


def _postrun(**_: Any) -> None:
    prof = getattr(_local, "profile", None)
    if prof is not None:
        prof.disable()


def _dump(**_: Any) -> None:
    import pstats

    if not _profiles or _PROFILE_DIR is None:
        return
    with _redis_lock:
        profiles = list(_profiles)
    stats = pstats.Stats(profiles[0])
    for prof in profiles[1:]:
        stats.add(prof)
    out = Path(_PROFILE_DIR) / f"tasks-{os.getpid()}.pstats"
    stats.dump_stats(str(out))


# --- optional per-task CPU and context switches ------------------------------

_TASK_CPU_DIR = os.environ.get("BENCH_TASK_CPU")
#: task name -> [tasks, thread CPU seconds, context switches]
_task_cpu: dict[str, list[float]] = {}


def _switches() -> int:
    """Context switches of the calling thread so far (voluntary and not)."""
    with open(f"/proc/self/task/{threading.get_native_id()}/status") as status:
        return sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)


def _cpu_prerun(**_: Any) -> None:
    if _TASK_CPU_DIR is not None and os.path.exists(os.path.join(_TASK_CPU_DIR, "on")):
        _local.cpu = (time.thread_time(), _switches())


def _cpu_postrun(task: Any = None, **_: Any) -> None:
    began = getattr(_local, "cpu", None)
    if began is None or task is None:
        return
    _local.cpu = None
    cpu, switches = time.thread_time() - began[0], _switches() - began[1]
    with _redis_lock:
        row = _task_cpu.setdefault(task.name, [0, 0.0, 0])
        row[0] += 1
        row[1] += cpu
        row[2] += switches


def _cpu_dump(**_: Any) -> None:
    if _TASK_CPU_DIR is not None and _task_cpu:
        with _redis_lock:
            rows = dict(_task_cpu)
        (Path(_TASK_CPU_DIR) / f"taskcpu-{os.getpid()}.json").write_text(json.dumps(rows))


if _TASK_CPU_DIR:
    task_prerun.connect(_cpu_prerun, weak=False)
    task_postrun.connect(_cpu_postrun, weak=False)
    worker_shutdown.connect(_cpu_dump, weak=False)
    worker_process_shutdown.connect(_cpu_dump, weak=False)

if _PROFILE_DIR:
    task_prerun.connect(_prerun, weak=False)
    task_postrun.connect(_postrun, weak=False)
    worker_shutdown.connect(_dump, weak=False)
    worker_process_shutdown.connect(_dump, weak=False)
