"""The no-op tool and the loopback-model agent the benchmarks share.

Imported by the workers (``CHORUS_MODULES``) and by the bench's client:

- ``bench_noop``: a tool that returns its argument;
- the agent ``bench-loopback``: model ``openai/loopback-bench`` at the
  loopback server's ``api_base``, the no-op tool, up to 1,000 steps;
  registered at import when ``BENCH_LLM_BASE`` is set (the bench starts
  :mod:`bench.loopback_server` and puts its URL there before it starts
  workers; the bench's own client calls :func:`register`). The job's input says
  what the model does (``steps=N tools=K``: K calls of ``bench_noop`` per
  step for N steps, then a short text, see :mod:`bench.loopback_server`).
  The API key is litellm's ``OPENAI_API_KEY`` from the environment (any
  value: the server does not check it), never in ``model_settings``.
"""

from __future__ import annotations

import os

from orchestrator import Agent, tool

#: Name of the agent on the loopback model.
LOOPBACK_AGENT = "bench-loopback"
#: The model string: litellm's OpenAI provider at the loopback ``api_base``.
LOOPBACK_MODEL = "openai/loopback-bench"
#: Environment variable holding the loopback server's base URL (``.../v1``).
BASE_ENV = "BENCH_LLM_BASE"
#: The longest turn the agent allows (AgentSpec caps max_steps at 1000).
MAX_STEPS = 1000


@tool
def bench_noop(i: int) -> int:
    """Do nothing and return the argument.

    Args:
        i: any integer.
    """
    return i


def job_input(steps: int, tools: int) -> str:
    """The job input that makes the loopback model call ``tools`` no-op tools
    per step for ``steps`` steps, then answer :func:`expected_answer`."""
    return f"steps={steps} tools={tools}"


def expected_answer(steps: int) -> str:
    return f"done after {steps} steps"


def register(base_url: str) -> None:
    """Register the agent on the loopback server at ``base_url`` (``.../v1``)."""
    Agent(
        LOOPBACK_AGENT,
        model=LOOPBACK_MODEL,
        system="Benchmark agent: call the no-op tool as told.",
        tools=[bench_noop],
        max_steps=MAX_STEPS,
        model_settings={"api_base": base_url},
    )


if os.environ.get(BASE_ENV):
    register(os.environ[BASE_ENV])
