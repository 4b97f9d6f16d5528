"""Tool and agent specifications: what a worker registered, as data."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from schemas.content import Frozen

#: Provider tool-name rule shared by OpenAI, Anthropic and Gemini (agent names follow it).
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"

#: A tool's registered (qualified) name: ``<namespace>.<name>`` or a bare
#: name, printable without whitespace, up to 200 characters (the stored
#: column). The model sees a provider-legal alias (``orchestrator.tools.names``).
TOOL_NAME_PATTERN = r"^[^\s\x00-\x1f\x7f]{1,200}$"

#: Model calls allowed in one turn unless the agent says otherwise: real
#: tool-heavy trajectories take dozens (an airline support turn took 27).
DEFAULT_MAX_STEPS = 100

#: The most policies one agent may list: each runs on every model call, so
#: the list is bounded, and a name may appear once (listing a policy twice
#: would run its hooks twice).
MAX_POLICIES = 32

#: Characters of a tool result the model sees whole unless the agent says
#: otherwise (about 8K tokens); a longer one is archived and shown as a view.
DEFAULT_TOOL_OUTPUT_LIMIT = 30_000

#: A subagent template ``X`` is offered to the model as the tool ``subagent__X``.
SUBAGENT_PREFIX = "subagent__"

#: A handoff target ``X`` is offered to the model as the tool ``handoff__X``.
HANDOFF_PREFIX = "handoff__"
#: The built-in tool reading a cut tool output; an agent may list it in its
#: ``tools`` to be offered it on every step (else only where one was cut).
READ_TOOL_OUTPUT = "read_tool_output"
#: The built-in tool an agent with an output schema gives its final answer with.
FINAL_ANSWER = "final_answer"

#: The tool of each field that names agents, by field.
_AGENT_TOOL_PREFIXES = {"subagents": SUBAGENT_PREFIX, "handoffs": HANDOFF_PREFIX}


class ToolSpec(Frozen):
    """A registered tool as the engine sees it; the model sees ``name``'s
    provider-legal alias (``orchestrator.tools.names``)."""

    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    parallelizable: bool = True
    queue: str = "tools"
    timeout: float = Field(default=300.0, gt=0)
    approval: bool = Field(
        default=False, description="Every call waits for a person's answer before it runs"
    )
    approval_timeout: float | None = Field(
        default=None,
        gt=0,
        description="Seconds a call waits for an answer before it is denied (None: no limit)",
    )


class RetryPolicy(Frozen):
    """Retries of a model call that failed with a retryable error (rate
    limit, timeout, connection, 5xx): exponential backoff with jitter.

    The defaults ride out about five minutes of provider trouble: ten
    attempts, waiting 2, 4, 8, 16, 32 s and then 60 s (the cap) between
    them, about 302 s in all before jitter.
    """

    max_attempts: int = Field(default=10, ge=1, le=50)
    initial_delay: float = Field(default=2.0, ge=0)
    factor: float = Field(default=2.0, ge=1)
    max_delay: float = Field(default=60.0, ge=0)
    jitter: float = Field(default=0.2, ge=0, le=1, description="± fraction of each delay")


class RateLimit(Frozen):
    """A limit on model calls shared by every worker (counted in Redis).

    ``key`` names the counter: the agent's model by default, or a template
    filled from the job's ``context_data`` (``"tenant:{tenant}"``). A call
    over the limit is deferred until the window has room, never dropped.
    """

    key: str | None = Field(default=None, max_length=200)
    requests: int | None = Field(default=None, gt=0, description="calls per period")
    tokens: int | None = Field(default=None, gt=0, description="tokens per period")
    count: Literal["input", "output", "total"] = Field(
        default="total", description="which tokens ``tokens`` counts"
    )
    period: float = Field(default=1.0, gt=0, description="seconds")


class Budget(Frozen):
    """Limits on one job, over its whole subagent tree. Unset: unlimited.

    When ``tool_calls`` is spent the model is told so and answers once more
    without tools; any other exceeded limit ends the job (``budget.exceeded``).
    """

    # an instance a caller built with model_copy(update=...) or model_construct
    # skipped validation: a job stored it and every step (and send()) failed on it
    model_config = ConfigDict(frozen=True, extra="forbid", revalidate_instances="always")

    cost_usd: float | None = Field(default=None, gt=0)
    tokens: int | None = Field(default=None, gt=0, description="input + output tokens")
    steps: int | None = Field(default=None, gt=0, description="model calls")
    tool_calls: int | None = Field(default=None, ge=0)
    wall_seconds: float | None = Field(default=None, gt=0)


class AgentSpec(Frozen):
    """An agent: a model, a system prompt, tool and toolset names and limits.

    ``model_settings`` are passed to litellm (``temperature``, ``api_base``,
    ...). Secrets never go here: litellm reads provider keys from the
    environment of the worker, and Chorus refuses credential keys when an
    agent is declared or a job submitted (``orchestrator.spec_checks``). A spec a
    job supplies inline (not a registered agent) may only say how the model
    samples, never where the call goes: ``orchestrator.spec_checks.check_inline``.
    """

    # an instance a caller built with model_copy(update=...) or model_construct
    # skipped validation: a job stored it and every step (and send()) failed on it
    model_config = ConfigDict(frozen=True, extra="forbid", revalidate_instances="always")

    name: str = Field(pattern=NAME_PATTERN)
    model: str = Field(min_length=1)
    system: str = ""
    tools: tuple[str, ...] = ()
    toolsets: tuple[str, ...] = Field(
        default=(),
        description="Names of registered MCP servers whose tools the model may call",
    )
    subagents: tuple[str, ...] = ()
    handoffs: tuple[str, ...] = Field(
        default=(),
        description="Registered agents this one may hand the conversation to "
        "(each offered as the tool handoff__<agent>)",
    )
    planning: bool = Field(
        default=False,
        description="Offer the manage_todo_list tool (a plan kept with the conversation)",
    )
    max_steps: int = Field(
        default=DEFAULT_MAX_STEPS, ge=1, le=1000, description="Model calls allowed in one turn"
    )
    max_parallel_tools: int | None = Field(
        default=None,
        ge=1,
        strict=True,
        description="Parallel tool calls of one step run at most this many at a time "
        "(None: all at once)",
    )
    retry: RetryPolicy = RetryPolicy()
    policies: tuple[Annotated[str, Field(pattern=NAME_PATTERN)], ...] = Field(
        default=(),
        max_length=MAX_POLICIES,
        description="Names of registered policies each model call goes through, in order "
        f"(at most {MAX_POLICIES}, each once)",
    )
    rate_limits: tuple[RateLimit, ...] = ()
    budget: Budget | None = Field(
        default=None, description="Default budget of jobs run on this agent."
    )
    output_schema: dict[str, Any] | None = Field(
        default=None,
        description="JSON schema (an object) of the structured final answer, given "
        "through the final_answer tool",
    )
    output_retries: int = Field(default=2, ge=0, le=10)
    context: tuple[str, ...] = Field(
        default=("checkpoint", "drop_orphaned_tool_calls"),
        description="Names of registered context transformers, applied in order",
    )
    context_tokens: int | None = Field(
        default=None, gt=0, description="Take a checkpoint before a prompt would pass this"
    )
    checkpoint_strategy: str = Field(default="briefing", max_length=64)
    tool_output_limit: int = Field(
        default=DEFAULT_TOOL_OUTPUT_LIMIT,
        ge=1000,
        le=1_000_000,
        description="Characters of a tool result the model sees whole; a longer one is "
        "kept whole in the database and the model sees its start and end, with a handle "
        "for the read_tool_output tool",
    )
    model_settings: dict[str, Any] = Field(default_factory=dict)
    approve: tuple[str, ...] = Field(
        default=(),
        description="Tools of this agent whose calls wait for a person's answer before "
        "they run (besides tools declared with approval=True)",
    )
    approval_timeout: float | None = Field(
        default=None,
        gt=0,
        description="Seconds a call of this agent waits for an answer before it is denied "
        "(None: no limit; a tool's own approval_timeout, if shorter, wins)",
    )

    @field_validator("approve")
    @classmethod
    def _approve_own_tools(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        # a field's check, not the model's: a model check would rename every
        # field's error location (the fields a refusal names)
        tools = info.data.get("tools", ())
        foreign = [name for name in value if name not in tools]
        if foreign:
            raise ValueError(
                f"approve names {foreign}, which are not tools of agent "
                f"{info.data.get('name')!r} (its tools: {list(tools)})"
            )
        return value

    @field_validator("subagents", "handoffs")
    @classmethod
    def _agent_names_fit(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        room = 64 - len(_AGENT_TOOL_PREFIXES[str(info.field_name)])
        long = [n for n in value if len(n) > room]
        if long:
            raise ValueError(
                f"{info.field_name} names longer than {room} characters "
                f"cannot be offered as tools: {long}"
            )
        return value

    @field_validator("policies")
    @classmethod
    def _policies_once(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        twice = sorted({n for n in value if value.count(n) > 1})
        if twice:
            raise ValueError(f"policies listed more than once: {twice}")
        return value

    @field_validator("output_schema")
    @classmethod
    def _object_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type") != "object":
            raise ValueError("output_schema must be a JSON schema of type 'object'")
        return value
