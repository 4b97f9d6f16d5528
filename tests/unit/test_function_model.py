"""The in-process models keep the model client's contract: deltas, a stop,
usage, parsed arguments, and ModelError for every failure."""

from __future__ import annotations

import pytest

from orchestrator.errors import ModelError
from orchestrator.llm.client import LiteLLMClient, ModelClient
from orchestrator.llm.function import FunctionModel, ModelRequest, ScriptedModel
from orchestrator.llm.reply import INVALID_ARGUMENTS_KEY
from orchestrator.llm.script import Reply, ScriptedToolCall, call

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "one two"}]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "", "parameters": {}}}]


def test_every_client_is_a_model_client() -> None:
    for client in (LiteLLMClient(), FunctionModel(lambda r: ""), ScriptedModel([])):
        assert isinstance(client, ModelClient)


def test_text_streams_in_word_pieces_and_calls_are_parsed() -> None:
    model = FunctionModel(
        lambda r: Reply.call(
            call("add", a=1), ScriptedToolCall("add", "{not json", id="c2"), text="Adding it up."
        )
    )
    pieces: list[str] = []
    reply = model.complete("test/m", MESSAGES, TOOLS, {"temperature": 0}, on_delta=pieces.append)
    assert pieces == ["Adding ", "it ", "up."] and reply.text == "Adding it up."
    assert [(c.tool, c.params) for c in reply.tool_calls] == [
        ("add", {"a": 1}),
        ("add", {INVALID_ARGUMENTS_KEY: "{not json"}),
    ]
    assert reply.tool_calls[1].tool_request_id == "c2"
    assert reply.finish_reason == "tool_calls" and not reply.stopped
    # usage: prompt words in, reply words (and a call's name and arguments) out
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (4, 3 + 3 + 3)
    (request,) = model.requests
    assert request == ModelRequest("test/m", MESSAGES, TOOLS, {"temperature": 0})
    assert (request.system, request.user_text, request.tool_names) == (
        "Be brief.",
        "one two",
        ["add"],
    )


def test_a_stop_returns_the_text_so_far_without_calls() -> None:
    model = FunctionModel(lambda r: Reply.call(call("add"), text="one two three"))
    pieces: list[str] = []
    reply = model.complete(
        "test/m", MESSAGES, None, {}, on_delta=pieces.append, should_stop=lambda: len(pieces) == 2
    )
    assert reply.stopped and reply.text == "one two " and reply.tool_calls == []


def test_set_usage_is_reported_as_given() -> None:
    model = FunctionModel(lambda r: Reply(text="hi", input_tokens=100, output_tokens=7))
    usage = model.complete("test/m", MESSAGES, None, {}).usage
    assert (usage.input_tokens, usage.output_tokens) == (100, 7)


def test_failures_are_model_errors() -> None:
    def overloaded(request: ModelRequest) -> str:
        raise ModelError("overloaded", status=529, retryable=True)

    with pytest.raises(ModelError) as raised:
        FunctionModel(overloaded).complete("test/m", MESSAGES, None, {})
    assert raised.value.status == 529 and raised.value.retryable

    def broken(request: ModelRequest) -> str:
        raise KeyError("x")

    with pytest.raises(ModelError, match="the model function raised KeyError") as raised:
        FunctionModel(broken).complete("test/m", MESSAGES, None, {})
    assert raised.value.status == 400 and not raised.value.retryable
    with pytest.raises(ModelError, match="not a Reply or a str"):
        FunctionModel(lambda r: 42).complete("test/m", MESSAGES, None, {})  # type: ignore[arg-type,return-value]


def test_a_script_is_played_by_step_and_ends() -> None:
    model = ScriptedModel([Reply.say("first"), lambda messages: Reply.say(f"{len(messages)}")])
    assert model.complete("test/m", MESSAGES, None, {}).text == "first"
    later = [*MESSAGES, {"role": "assistant", "content": "first"}]
    assert model.complete("test/m", later, None, {}).text == "3"
    done = [*later, {"role": "assistant", "content": "3"}]
    with pytest.raises(ModelError, match="script 'test/m' is exhausted: it has 2 replies"):
        model.complete("test/m", done, None, {})
