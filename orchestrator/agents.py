"""``Agent(...)``: declare an agent in Python and register it by name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator import registry
from orchestrator.engine.access import builtin_names
from orchestrator.errors import invalid
from orchestrator.policies import Policy, check_policies
from orchestrator.spec_checks import check_spec
from orchestrator.tools.calls import Tool
from orchestrator.tools.mcp_server import MCPServerSpec
from orchestrator.tools.names import check_unique
from schemas import AgentSpec, Budget, RateLimit, RetryPolicy
from schemas.specs import HANDOFF_PREFIX, READ_TOOL_OUTPUT, SUBAGENT_PREFIX

#: ``AgentSpec`` fields that ``Agent`` takes under another name (``output``
#: also accepts a pydantic model, turned into the spec's JSON schema;
#: ``tools`` also takes ``MCPServer`` objects, stored as ``toolsets``).
RENAMED_FIELDS = {"output_schema": "output", "toolsets": "tools"}


def _default(field: str) -> Any:
    """The spec's own default, so ``Agent`` and ``AgentSpec`` cannot disagree."""
    return AgentSpec.model_fields[field].get_default(call_default_factory=True)


_RETRY: RetryPolicy = _default("retry")
_CONTEXT: tuple[str, ...] = _default("context")


def Agent(
    name: str,
    model: str,
    system: str = "",
    tools: Sequence[Tool | MCPServerSpec | str] = (),
    *,
    subagents: list[AgentSpec | str] | tuple[AgentSpec | str, ...] = (),
    handoffs: list[AgentSpec | str] | tuple[AgentSpec | str, ...] = (),
    planning: bool = False,
    max_steps: int = _default("max_steps"),
    max_parallel_tools: int | None = None,
    retry: RetryPolicy = _RETRY,
    policies: Sequence[Policy | str] = (),
    rate_limits: list[RateLimit] | tuple[RateLimit, ...] = (),
    budget: Budget | None = None,
    output: type[BaseModel] | dict[str, Any] | None = None,
    output_retries: int = _default("output_retries"),
    context: list[str] | tuple[str, ...] = _CONTEXT,
    context_tokens: int | None = None,
    checkpoint_strategy: str = _default("checkpoint_strategy"),
    tool_output_limit: int = _default("tool_output_limit"),
    model_settings: dict[str, Any] | None = None,
    approve: Sequence[Tool | str] = (),
    approval_timeout: float | None = None,
) -> AgentSpec:
    """Declare an agent and register it, so jobs can name it.

    Every field of :class:`~schemas.AgentSpec` is an argument here
    (``output_schema`` is ``output``).

    Args:
        name: the name jobs use (letters, digits, ``_`` and ``-``).
        model: a litellm model string, e.g. ``openai/gpt-4o`` or ``scripted/demo``.
        system: the system prompt.
        tools: tools (``@tool`` or :func:`~orchestrator.schema_tool` objects,
            or registered qualified names) the model may call, and MCP
            servers (``MCPServer`` objects) whose every tool it may call
            (stored in the spec's ``toolsets``). Two whose provider-legal
            aliases collide raise :class:`ConfigurationError`. The name
            ``"read_tool_output"`` asks for that built-in on every step
            (otherwise it is offered only where an output was cut).
        subagents: agents (specs or registered names) the model may delegate
            to; each is offered as the tool ``subagent__<name>``.
        handoffs: registered agents (specs or names) the model may hand the
            conversation to; each is offered as the tool ``handoff__<name>``,
            and the target takes over the turn until it answers.
        planning: offer the ``manage_todo_list`` tool: the model keeps a todo
            list with the conversation (``Client.plan``, ``plan.updated``).
        max_steps: model calls allowed in one turn before it fails (default 100).
        max_parallel_tools: at most this many tool calls of one step run at
            once (a longer run of parallel calls is split into segments of
            this size, run one after the other); None runs them all at once.
        retry: backoff of model calls failing with a retryable error (the
            default rides out about five minutes of provider trouble).
        policies: registered policies (objects or names) each model call
            goes through, in order (``orchestrator.policies``); a name not
            registered raises :class:`UnknownPolicyError`.
        rate_limits: limits on model calls shared by every worker.
        budget: the default budget of jobs on this agent (over their tree).
        output: a pydantic model or JSON schema of a structured final answer:
            the model gets a ``final_answer`` tool taking it, and the job's
            ``status().structured`` carries the validated object (as JSON);
            ``job.output()`` returns it as an instance of the model, in a
            process that declared the agent (see :func:`~orchestrator.job_reads.typed_output`).
        output_retries: invalid structured answers the model may correct
            before the turn fails.
        context: names of registered context transformers shaping what the
            model sees, applied in order.
        context_tokens: take a checkpoint before a prompt would pass this many tokens.
        checkpoint_strategy: the registered checkpoint strategy (its prompt).
        tool_output_limit: characters of a tool result the model sees whole
            (default 30,000); a longer one is kept whole in the database and
            the model sees its start and end with a handle it passes to the
            built-in ``read_tool_output`` tool to read the rest.
        model_settings: extra litellm arguments (``temperature``, ``api_base``);
            never secrets, which litellm reads from the worker's environment.
        approve: tools of this agent (objects or names, each also in
            ``tools``) whose calls wait for a person's answer before they run
            (``Client.approve`` / ``Client.deny``), besides tools declared
            with ``approval=True``; a name not among its tools raises
            :class:`InvalidRequestError`.
        approval_timeout: seconds a call of this agent waits for an answer
            before it is denied ("no answer in N s"); None: no limit. A
            tool's own ``approval_timeout``, if shorter, wins.
    """
    try:
        spec = AgentSpec(
            name=name,
            model=model,
            system=system,
            tools=tuple(
                t.spec.name if isinstance(t, Tool) else t
                for t in tools
                if not isinstance(t, MCPServerSpec)
            ),
            toolsets=tuple(t.name for t in tools if isinstance(t, MCPServerSpec)),
            subagents=tuple(a.name if isinstance(a, AgentSpec) else a for a in subagents),
            handoffs=tuple(a.name if isinstance(a, AgentSpec) else a for a in handoffs),
            planning=planning,
            max_steps=max_steps,
            max_parallel_tools=max_parallel_tools,
            retry=retry,
            policies=tuple(p.name if isinstance(p, Policy) else p for p in policies),
            rate_limits=tuple(rate_limits),
            budget=budget,
            output_schema=output.model_json_schema() if isinstance(output, type) else output,
            output_retries=output_retries,
            context=tuple(context),
            context_tokens=context_tokens,
            checkpoint_strategy=checkpoint_strategy,
            tool_output_limit=tool_output_limit,
            model_settings=model_settings or {},
            approve=tuple(t.spec.name if isinstance(t, Tool) else t for t in approve),
            approval_timeout=approval_timeout,
        )
    except ValidationError as exc:
        raise invalid(exc, f"agent {name!r}") from None
    check_spec(spec)
    check_policies(spec.policies)
    check_unique(offered_names(spec), f"agent {name!r}")
    registry.register_agent(spec)
    if isinstance(output, type):
        registry.register_output_model(name, output)
    return spec


def offered_names(spec: AgentSpec) -> list[str]:
    """The names of every tool the agent's model is offered: its tools, one
    ``subagent__X`` per subagent and ``handoff__X`` per handoff target, and
    the built-in tools it asked for or needs."""
    return [
        # listing read_tool_output asks for the built-in (below), unless a tool takes its name
        *(t for t in spec.tools if t != READ_TOOL_OUTPUT or t in registry.tool_names()),
        *(f"{SUBAGENT_PREFIX}{a}" for a in spec.subagents),
        *(f"{HANDOFF_PREFIX}{a}" for a in spec.handoffs),
        *builtin_names(spec),
    ]
