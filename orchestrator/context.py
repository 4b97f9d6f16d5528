"""Context transformers: shape what the model sees, never what is stored.

A transformer takes the stored history and a :class:`TransformContext`
and returns the history to send. They are registered by name
(:func:`context_transformer`) and an agent lists the chain it uses
(``Agent(..., context=[...])``), applied in order. Built in:

* ``checkpoint``: history up to the latest checkpoint's boundary is
  replaced by its summary;
* ``drop_orphaned_tool_calls``: tool calls without a result (a failed or
  cancelled turn) and results without a call are removed.

Provider-specific fixes are transformers too: they get the model string.

A transformer must not change the messages it is given (their ``content``
lists included): a worker keeps them for every later step of the
conversation. It returns new messages where it changes something, and the
same objects where it does not (those are sent in the form already cached).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator.errors import InvalidRequestError
from schemas import AgentSpec, Message, Role, TextBlock, ToolCallBlock, ToolResultBlock

#: How a checkpoint's summary is shown to the model.
SUMMARY_PREFIX = "Briefing on the conversation so far (earlier messages were summarized):\n\n"


@dataclass(frozen=True)
class TransformContext:
    """What a transformer may look at besides the history."""

    agent: AgentSpec
    #: Index of the latest checkpoint's boundary message in the history the
    #: chain is given. A chain that starts with ``checkpoint`` is given the
    #: history from the boundary on (0 here): nothing before it is loaded.
    boundary: int | None = None
    summary: str | None = None

    @property
    def model(self) -> str:
        return self.agent.model


Transformer = Callable[[list[Message], TransformContext], list[Message]]
_transformers: dict[str, Transformer] = {}


def context_transformer(name: str) -> Callable[[Transformer], Transformer]:
    """Register a transformer under ``name`` for agents to list."""

    def register(fn: Transformer) -> Transformer:
        _transformers[name] = fn
        return fn

    return register


@context_transformer("checkpoint")
def replace_with_checkpoint(history: list[Message], ctx: TransformContext) -> list[Message]:
    if ctx.boundary is None or ctx.summary is None:
        return history
    summary = Message(role=Role.USER, content=[TextBlock(text=SUMMARY_PREFIX + ctx.summary)])
    return [summary, *history[ctx.boundary + 1 :]]


@context_transformer("drop_orphaned_tool_calls")
def drop_orphaned_tool_calls(history: list[Message], _ctx: TransformContext) -> list[Message]:
    """Remove tool calls that never got a result (a failed or cancelled turn),
    and results whose call is gone; providers reject both."""
    called: set[str] = set()
    answered: set[str] = set()
    for message in history:
        for block in message.content:
            if isinstance(block, ToolCallBlock):
                called.add(block.tool_request_id)
            elif isinstance(block, ToolResultBlock):
                answered.add(block.tool_request_id)
    if called == answered and all(message.content for message in history):
        return history  # nothing orphaned: every message as it is
    paired = called & answered
    out: list[Message] = []
    for message in history:
        content = [
            b
            for b in message.content
            if not isinstance(b, ToolCallBlock | ToolResultBlock) or b.tool_request_id in paired
        ]
        if content and len(content) == len(message.content):
            out.append(message)  # unchanged: the same object, sent in its cached form
        elif content:
            out.append(message.model_copy(update={"content": content}))
    return out


def apply(
    history: list[Message], ctx: TransformContext, names: Sequence[str] | None = None
) -> list[Message]:
    """Run the agent's chain (or ``names``) over the history."""
    for name in ctx.agent.context if names is None else names:
        history = transformer(ctx.agent, name)(history, ctx)
    return history


def transformer(agent: AgentSpec, name: str) -> Transformer:
    """The transformer ``name`` that ``agent`` lists; raises
    :class:`~orchestrator.errors.InvalidRequestError` if none is registered."""
    try:
        return _transformers[name]
    except KeyError:
        raise InvalidRequestError(
            f"agent {agent.name!r} names an unknown context transformer {name!r}; "
            f"registered: {sorted(_transformers)}",
            ["context"],
        ) from None
