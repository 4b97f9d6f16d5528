"""Context transformers: shape what the model sees, never what is stored.

A transformer maps the stored history to the history sent to the model.
They compose left to right; :data:`DEFAULT_TRANSFORMERS` is the chain used
for every step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from schemas import Message, ToolCallBlock, ToolResultBlock

Transformer = Callable[[list[Message]], list[Message]]


def drop_orphaned_tool_calls(history: list[Message]) -> list[Message]:
    """Remove tool calls that never got a result (a failed or cancelled turn),
    and results whose call is gone; providers reject both."""
    called = {b.tool_request_id for m in history for b in m.content if isinstance(b, ToolCallBlock)}
    answered = {
        b.tool_request_id for m in history for b in m.content if isinstance(b, ToolResultBlock)
    }
    paired = called & answered
    out: list[Message] = []
    for message in history:
        content = [
            b
            for b in message.content
            if not isinstance(b, ToolCallBlock | ToolResultBlock) or b.tool_request_id in paired
        ]
        if content:
            out.append(message.model_copy(update={"content": content}))
    return out


DEFAULT_TRANSFORMERS: tuple[Transformer, ...] = (drop_orphaned_tool_calls,)


def apply(
    history: list[Message], transformers: Sequence[Transformer] = DEFAULT_TRANSFORMERS
) -> list[Message]:
    for transform in transformers:
        history = transform(history)
    return history
