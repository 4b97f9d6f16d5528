"""Worker-side half of ``bench/fanout.py``: the agents of the fan-out bench.

Imported by the workers (and the bench's client) through
``CHORUS_MODULES=bench.fanout_tasks``. It registers:

- the child agent ``bench-fanout-child``, no tools, answering at once:
  when ``BENCH_LLM_BASE`` is set (``bench/fanout.py --model loopback``, the
  default), the loopback server's model ``openai/loopback-bench`` (an
  OpenAI-protocol provider: the openai SDK path, as production OpenAI
  traffic), which answers ``done after 0 steps``; otherwise a scripted
  model (litellm's custom-provider stream path) answering ``done <task>``;
- one parent agent ``bench-fanout-<N>`` per size N named in
  ``CHORUS_BENCH_FANOUT_SIZES`` (comma-separated, read at import; default
  ``10,100,1000``): its scripted model calls ``subagent__bench-fanout-child``
  N times in one reply (all parallelizable: one segment, one chord), then
  answers ``children=<results> ok=<successful results>`` from the tool
  results it is shown.

The bench sets ``CHORUS_BENCH_FANOUT_SIZES`` to the sizes it runs (its warm-up
size included) in the workers' environment and in its own before importing
this module, so both sides register the same agents.
"""

from __future__ import annotations

import os
from typing import Any

from bench.loopback_agent import BASE_ENV, LOOPBACK_MODEL
from orchestrator import Agent
from orchestrator.llm.scripted import Reply, call, register_script, scripted_model

#: Name of the child agent (and of its script).
CHILD = "bench-fanout-child"
#: Environment variable naming the fan-out sizes to register.
SIZES_ENV = "CHORUS_BENCH_FANOUT_SIZES"
DEFAULT_SIZES = (10, 100, 1000)


def parse_sizes(text: str | None) -> tuple[int, ...]:
    """``"10,100,1000"`` → ``(10, 100, 1000)``: positive, unique, in order given."""
    if not text or not text.strip():
        return DEFAULT_SIZES
    sizes: list[int] = []
    for part in text.split(","):
        n = int(part.strip())
        if n < 1:
            raise ValueError(f"{SIZES_ENV}: sizes must be positive, got {n}")
        if n not in sizes:
            sizes.append(n)
    return tuple(sizes)


def parent_agent(n: int) -> str:
    """Name of the parent agent (and script) that fans out to ``n`` children."""
    return f"bench-fanout-{n}"


def expected_answer(n: int) -> str:
    return f"children={n} ok={n}"


def _child_reply(messages: list[dict[str, Any]]) -> Reply:
    task = next((m.get("content") for m in messages if m.get("role") == "user"), "")
    return Reply.say(f"done {task}")


def _tally(messages: list[dict[str, Any]]) -> Reply:
    """The parent's answer once every child has answered: how many results,
    and how many were a child's answer (not an error such as a limit)."""
    results = [str(m.get("content") or "") for m in messages if m.get("role") == "tool"]
    ok = sum(1 for r in results if r.startswith("done "))
    return Reply.say(f"children={len(results)} ok={ok}")


if os.environ.get(BASE_ENV):
    Agent(
        CHILD,
        LOOPBACK_MODEL,
        system="Benchmark child: answers at once.",
        model_settings={"api_base": os.environ[BASE_ENV]},
    )
else:
    register_script(CHILD, [_child_reply])
    Agent(CHILD, scripted_model(CHILD), system="Benchmark child: answers at once.")

SIZES = parse_sizes(os.environ.get(SIZES_ENV))
for _n in SIZES:
    _calls = [call(f"subagent__{CHILD}", task=f"t{i}") for i in range(_n)]
    register_script(parent_agent(_n), [Reply.call(*_calls), _tally])
    Agent(
        parent_agent(_n),
        scripted_model(parent_agent(_n)),
        system=f"Benchmark parent: delegates {_n} tasks at once.",
        subagents=[CHILD],
    )
