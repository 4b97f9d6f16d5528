"""Context transformers compose, and never touch what is stored."""

from __future__ import annotations

import pytest

from orchestrator.context import SUMMARY_PREFIX, TransformContext, apply, context_transformer
from orchestrator.errors import InvalidRequestError
from schemas import AgentSpec, Message, Role, TextBlock, ToolCallBlock, ToolResultBlock


def text(role: Role, value: str) -> Message:
    return Message(role=role, content=[TextBlock(text=value)])


HISTORY = [
    text(Role.USER, "one"),
    text(Role.ASSISTANT, "two"),
    Message(
        role=Role.ASSISTANT,
        content=[ToolCallBlock(tool_request_id="lost", tool="search", params={})],
    ),
    text(Role.USER, "three"),
]


@context_transformer("shout")
def shout(history: list[Message], ctx: TransformContext) -> list[Message]:
    """A provider-specific fix: it knows the model it prepares for."""
    suffix = "!" if ctx.model.startswith("loud/") else ""
    return [m.model_copy(update={"content": [TextBlock(text=m.text + suffix)]}) for m in history]


def test_default_chain_summarizes_then_drops_orphaned_calls() -> None:
    ctx = TransformContext(agent=AgentSpec(name="a", model="x/y"), boundary=1, summary="S")
    out = apply(list(HISTORY), ctx)
    assert [m.text for m in out] == [SUMMARY_PREFIX + "S", "three"]
    assert HISTORY[0].text == "one"  # the input list's messages are untouched


def test_an_agent_sets_its_own_chain_in_order() -> None:
    agent = AgentSpec(name="a", model="loud/m", context=("drop_orphaned_tool_calls", "shout"))
    out = apply(list(HISTORY), TransformContext(agent=agent))
    assert [m.text for m in out] == ["one!", "two!", "three!"]


def test_results_without_calls_are_dropped_too() -> None:
    history = [
        Message(
            role=Role.USER,
            content=[
                ToolResultBlock(tool_request_id="gone", tool="t", result=1),
                TextBlock(text="hi"),
            ],
        )
    ]
    out = apply(history, TransformContext(agent=AgentSpec(name="a", model="x/y")))
    assert out[0].content == [TextBlock(text="hi")]


def test_unknown_transformer_is_a_clear_error() -> None:
    agent = AgentSpec(name="a", model="x/y", context=("nope",))
    with pytest.raises(InvalidRequestError, match="unknown context transformer 'nope'"):
        apply([], TransformContext(agent=agent))
