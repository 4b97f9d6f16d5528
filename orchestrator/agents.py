"""``Agent(...)``: declare an agent in Python and register it by name."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator import registry
from orchestrator.errors import invalid
from orchestrator.specs import check_spec
from orchestrator.tools import Tool
from schemas import AgentSpec, Budget, RateLimit


def Agent(
    name: str,
    model: str,
    system: str = "",
    tools: list[Tool | str] | tuple[Tool | str, ...] = (),
    *,
    subagents: list[AgentSpec | str] | tuple[AgentSpec | str, ...] = (),
    max_steps: int = 25,
    rate_limits: list[RateLimit] | tuple[RateLimit, ...] = (),
    budget: Budget | None = None,
    output: type[BaseModel] | dict[str, Any] | None = None,
    model_settings: dict[str, Any] | None = None,
) -> AgentSpec:
    """Declare an agent and register it, so jobs can name it.

    Args:
        name: the name jobs use (letters, digits, ``_`` and ``-``).
        model: a litellm model string, e.g. ``openai/gpt-4o`` or ``scripted/demo``.
        system: the system prompt.
        tools: tools (``@tool`` objects or registered names) the model may call.
        subagents: agents (specs or registered names) the model may delegate
            to; each is offered as the tool ``subagent__<name>``.
        max_steps: model calls allowed in one turn before it fails.
        rate_limits: limits on model calls shared by every worker.
        budget: the default budget of jobs on this agent (over their tree).
        output: a pydantic model or JSON schema of a structured final answer:
            the model gets a ``final_answer`` tool taking it, and the job's
            ``status().structured`` carries the validated object.
        model_settings: extra litellm arguments (``temperature``, ``api_base``);
            never secrets, which litellm reads from the worker's environment.
    """
    try:
        spec = AgentSpec(
            name=name,
            model=model,
            system=system,
            tools=tuple(t.spec.name if isinstance(t, Tool) else t for t in tools),
            subagents=tuple(a.name if isinstance(a, AgentSpec) else a for a in subagents),
            max_steps=max_steps,
            rate_limits=tuple(rate_limits),
            budget=budget,
            output_schema=output.model_json_schema() if isinstance(output, type) else output,
            model_settings=model_settings or {},
        )
    except ValidationError as exc:
        raise invalid(exc, f"agent {name!r}") from None
    check_spec(spec)
    registry.register_agent(spec)
    return spec
