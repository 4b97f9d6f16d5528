"""A multi-agent pipeline: planner → implementer → critic, until approved or out of budget.

Three agents on three models, written with Chorus's own primitives:

* ``pipeline-planner`` runs the loop. Each iteration it writes a plan and
  delegates it to the implementer (``subagent__pipeline-implementer``),
  then hands the draft to the critic (``subagent__pipeline-critic``). An
  approval ends the job with the draft; a rejection's feedback goes into
  the next plan.
* ``pipeline-implementer`` turns a plan into a draft.
* ``pipeline-critic`` answers with a structured verdict (``Verdict``:
  ``approved``, ``feedback``) through the ``final_answer`` tool.

The loop is bounded by the job's budget, over the whole tree
(:func:`pipeline_budget`): an iteration is four model calls (two of the
planner's, one each of the implementer and the critic), so ``steps`` bounds
the iterations; ``cost_usd`` and ``wall_seconds`` bound money and time. A
spent budget stops the tree, and the job's status says which one:
``status().error == "steps budget exceeded: 17 model calls used of 17"``.

The models here are scripted (deterministic, reached through litellm like
any provider, with prices so that cost budgets mean something). The input
is a task on its first line and its requirements as ``- `` lines; the
planner's first plan covers the first requirement only, the critic rejects
a draft that misses one and names the first it misses, and the planner adds
it. So with N requirements the critic approves on iteration N. Swap the
model strings for real ones (and drop the scripts) to run it for real.

Run it with ``chorus local --example pipeline``.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from orchestrator import Agent
from orchestrator.llm.scripted import Reply, call, register_script, scripted_model
from schemas import Budget

PLANNER, IMPLEMENTER, CRITIC = "pipeline-planner", "pipeline-implementer", "pipeline-critic"
#: Iterations the planner's default budget allows.
MAX_ITERATIONS = 4
#: Model calls of one iteration: the planner delegates twice, the others answer once.
CALLS_PER_ITERATION = 4
#: Tokens each scripted call reports, and each model's price per token (in, out).
TOKENS = (1000, 200)
PRICES = {PLANNER: (1e-6, 4e-6), IMPLEMENTER: (3e-6, 15e-6), CRITIC: (0.5e-6, 2e-6)}


def _priced(name: str) -> dict[str, float]:
    """The per-token price of a model, as ``model_settings`` (litellm prices
    the calls with it; the scripted models have no price of their own)."""
    cost_in, cost_out = PRICES[name]
    return {"input_cost_per_token": cost_in, "output_cost_per_token": cost_out}


class Verdict(BaseModel):
    """The critic's answer."""

    approved: bool
    feedback: str = Field(description="what to change; empty when approved")


def pipeline_budget(
    iterations: int = MAX_ITERATIONS, cost_usd: float = 0.5, wall_seconds: float = 300.0
) -> Budget:
    """A job budget allowing ``iterations`` full iterations (and the
    planner's final answer), ``cost_usd`` and ``wall_seconds``."""
    return Budget(
        steps=CALLS_PER_ITERATION * iterations + 1, cost_usd=cost_usd, wall_seconds=wall_seconds
    )


def _reply(**kwargs: Any) -> Reply:
    return Reply(input_tokens=TOKENS[0], output_tokens=TOKENS[1], **kwargs)


def _requirements(text: str) -> list[str]:
    return [line[2:].strip() for line in text.splitlines() if line.startswith("- ")]


# --- the planner: the loop -----------------------------------------------------


def _planner(messages: list[dict[str, Any]]) -> Reply:
    task = str(next(m["content"] for m in messages if m["role"] == "user"))
    results = [m for m in messages if m["role"] == "tool"]
    verdicts = [json.loads(m["content"]) for m in results if m["name"].endswith(CRITIC)]
    if results and results[-1]["name"].endswith(IMPLEMENTER):  # a draft: have it reviewed
        review = f"Review this draft.\n\nTask:\n{task}\n\nDraft:\n{results[-1]['content']}"
        return _reply(tool_calls=[call(f"subagent__{CRITIC}", task=review)])
    if verdicts and verdicts[-1]["approved"]:
        draft = [m for m in results if m["name"].endswith(IMPLEMENTER)][-1]["content"]
        return _reply(text=f"Approved on iteration {len(verdicts)}.\n{draft}")
    steps = _requirements(task)[:1] + [v["feedback"] for v in verdicts]
    plan = "\n".join(
        [f"Plan, iteration {len(verdicts) + 1}: {task.splitlines()[0]}"] + [f"- {s}" for s in steps]
    )
    return _reply(tool_calls=[call(f"subagent__{IMPLEMENTER}", task=plan)])


# --- the implementer and the critic ---------------------------------------------


def _implementer(messages: list[dict[str, Any]]) -> Reply:
    plan = str(messages[-1]["content"])
    done = "\n".join(f"# done: {step}" for step in _requirements(plan))
    return _reply(text=f"def slugify(title: str) -> str:\n{done}")


def _critic(messages: list[dict[str, Any]]) -> Reply:
    review = str(messages[-1]["content"])
    task, _, draft = review.partition("\n\nDraft:\n")
    missing = [r for r in _requirements(task) if f"# done: {r}" not in draft]
    verdict = Verdict(approved=not missing, feedback=missing[0] if missing else "")
    return _reply(tool_calls=[call("final_answer", **verdict.model_dump())])


register_script(PLANNER, [_planner] * 100)
register_script(IMPLEMENTER, [_implementer] * 10)
register_script(CRITIC, [_critic] * 10)

implementer = Agent(
    IMPLEMENTER,
    scripted_model(IMPLEMENTER),
    system="You implement the plan you are given.",
    model_settings=_priced(IMPLEMENTER),
)
critic = Agent(
    CRITIC,
    scripted_model(CRITIC),
    system="You review a draft against its task. Approve it only if it meets every requirement.",
    model_settings=_priced(CRITIC),
    output=Verdict,
)
planner = Agent(
    PLANNER,
    scripted_model(PLANNER),
    system="You plan the work, have the implementer do it and the critic review it, "
    "and iterate on the critic's feedback until the critic approves.",
    subagents=[implementer, critic],
    budget=pipeline_budget(),
    model_settings=_priced(PLANNER),
)
