"""The scripted model, through litellm's real custom-provider code path."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from orchestrator.errors import ModelError
from orchestrator.llm.call import INVALID_ARGUMENTS_KEY, complete, is_retryable, to_openai_messages
from orchestrator.llm.scripted import (
    Reply,
    ScriptedToolCall,
    call,
    install,
    offered_tools,
    register_script,
    scripted_model,
    unregister_script,
)
from schemas.content import Message, Role, TextBlock, ToolResultBlock

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}
USER = [{"role": "user", "content": "What is the weather in Paris today?"}]


@pytest.fixture
def script() -> Any:
    """Register a uniquely named script; returns a function name -> model string."""
    names: list[str] = []

    def _register(*replies: Any) -> str:
        name = f"test-{uuid.uuid4().hex[:8]}"
        names.append(name)
        register_script(name, list(replies))
        return scripted_model(name)

    yield _register
    for name in names:
        unregister_script(name)


def test_text_reply_streams_in_several_deltas(script: Any) -> None:
    model = script(Reply.say("It is sunny and mild in Paris today."))
    deltas: list[str] = []

    reply = complete(model, USER, [SEARCH_TOOL], {}, on_delta=deltas.append)

    assert reply.text == "It is sunny and mild in Paris today."
    assert len(deltas) > 1
    assert "".join(deltas) == reply.text
    assert reply.tool_calls == []
    assert reply.usage.input_tokens == 7  # words of the prompt
    assert reply.usage.output_tokens == 8  # words of the reply
    assert reply.usage.cost_usd == 0.0  # litellm cannot price it: no error
    assert reply.finish_reason == "stop"
    assert not reply.stopped


def test_two_tool_calls_with_unique_ids(script: Any) -> None:
    model = script(
        Reply.call(
            call("search", q="Paris weather"), call("search", q="Paris news"), text="Let me check."
        )
    )

    first = complete(model, USER, [SEARCH_TOOL], {})
    second = complete(model, USER, [SEARCH_TOOL], {})

    assert first.text == "Let me check."
    assert [(c.tool, c.params) for c in first.tool_calls] == [
        ("search", {"q": "Paris weather"}),
        ("search", {"q": "Paris news"}),
    ]
    ids = [c.tool_request_id for c in first.tool_calls + second.tool_calls]
    assert len(set(ids)) == 4  # unique within a reply and across conversations
    assert all(i.startswith("call_") for i in ids)
    assert first.finish_reason == "tool_calls"
    assert first.usage.output_tokens > 0


def test_unknown_tool_and_invalid_arguments_are_emitted(script: Any) -> None:
    model = script(
        Reply.call(
            call("no_such_tool", x=1),
            ScriptedToolCall("search", "{not json"),
            ScriptedToolCall("search", "[1, 2]", id="fixed-id"),
        )
    )

    reply = complete(model, USER, [SEARCH_TOOL], {})

    assert [c.tool for c in reply.tool_calls] == ["no_such_tool", "search", "search"]
    assert reply.tool_calls[0].params == {"x": 1}
    assert reply.tool_calls[1].params == {INVALID_ARGUMENTS_KEY: "{not json"}
    assert reply.tool_calls[2].params == {INVALID_ARGUMENTS_KEY: "[1, 2]"}
    assert reply.tool_calls[2].tool_request_id == "fixed-id"


def test_callable_reply_quotes_the_tool_result(script: Any) -> None:
    def answer(messages: list[dict[str, Any]]) -> Reply:
        tool_message = messages[-1]
        assert tool_message["role"] == "tool"
        return Reply.say(f"The tool said {tool_message['content']}")

    model = script(Reply.call(call("search", q="Paris")), answer)
    first = complete(model, to_openai_messages("Be brief.", [_user("Weather?")]), [SEARCH_TOOL], {})
    (tool_call,) = first.tool_calls
    history = [
        _user("Weather?"),
        Message(role=Role.ASSISTANT, content=[tool_call]),
        Message(
            role=Role.USER,
            content=[
                ToolResultBlock(
                    tool_request_id=tool_call.tool_request_id, tool="search", result={"sky": "blue"}
                )
            ],
        ),
    ]

    second = complete(model, to_openai_messages("Be brief.", history), [SEARCH_TOOL], {})

    assert second.text == 'The tool said {"sky": "blue"}'
    assert second.tool_calls == []


def test_reply_index_counts_assistant_messages(script: Any) -> None:
    model = script(Reply.say("one"), Reply.say("two"), Reply.say("three"))
    conversation = [
        *USER,
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "again"},
    ]

    assert complete(model, conversation, None, {}).text == "three"


def test_usage_can_be_set_by_the_reply(script: Any) -> None:
    model = script(Reply(text="hi", input_tokens=1000, output_tokens=20))

    usage = complete(model, USER, None, {}).usage

    assert (usage.input_tokens, usage.output_tokens) == (1000, 20)


def test_exhausted_script_raises_model_error(script: Any) -> None:
    model = script(Reply.say("only one"))
    conversation = [*USER, {"role": "assistant", "content": "only one"}, *USER]

    with pytest.raises(ModelError, match="exhausted") as caught:
        complete(model, conversation, None, {})

    assert caught.value.status == 400
    assert not is_retryable(caught.value.__cause__)  # type: ignore[arg-type]


def test_unknown_script_and_failing_callable_raise_model_error(script: Any) -> None:
    with pytest.raises(ModelError, match="no script named"):
        complete(scripted_model("never-registered"), USER, None, {})

    def broken(messages: list[dict[str, Any]]) -> Reply:
        raise KeyError("oops")

    with pytest.raises(ModelError, match="raised KeyError"):
        complete(script(broken), USER, None, {})


def test_should_stop_ends_the_stream_early(script: Any) -> None:
    model = script(Reply.call(call("search", q="x"), text="a b c d e f g h"))
    deltas: list[str] = []

    reply = complete(
        model, USER, None, {}, on_delta=deltas.append, should_stop=lambda: len(deltas) >= 2
    )

    assert reply.stopped
    assert reply.text == "a b "
    assert reply.tool_calls == []  # partial calls are dropped


def test_direct_litellm_paths_sync_async_streaming_and_not(script: Any) -> None:
    import litellm

    install()
    model = script(Reply.call(call("search", q="x"), text="hello world"))

    plain = litellm.completion(model=model, messages=USER, tools=[SEARCH_TOOL])
    assert plain.choices[0].message.content == "hello world"
    assert plain.choices[0].message.tool_calls[0].function.name == "search"
    assert plain.usage.completion_tokens > 0

    async def run() -> tuple[Any, list[Any]]:
        response = await litellm.acompletion(model=model, messages=USER)
        stream = await litellm.acompletion(
            model=model, messages=USER, stream=True, stream_options={"include_usage": True}
        )
        return response, [chunk async for chunk in stream]

    response, chunks = asyncio.run(run())
    assert response.choices[0].message.tool_calls[0].function.arguments == '{"q": "x"}'
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert text == "hello world"
    assert calls[0].id and calls[0].function.name == "search"
    assert "".join(tc.function.arguments or "" for tc in calls) == '{"q": "x"}'
    assert any(getattr(c, "usage", None) for c in chunks)


def test_install_is_idempotent() -> None:
    import litellm

    install()
    install()

    assert [p["provider"] for p in litellm.custom_provider_map].count("scripted") == 1


def test_register_script_rejects_blank_names() -> None:
    with pytest.raises(ValueError):
        register_script(" ", [Reply.say("x")])


def _user(text: str) -> Message:
    return Message(role=Role.USER, content=[TextBlock(text=text)])


def test_a_reply_function_can_see_the_offered_tools(script: Any) -> None:
    model = script(
        lambda messages: Reply.say(
            "offered: " + ",".join(t["function"]["name"] for t in offered_tools())
        )
    )

    assert complete(model, USER, [SEARCH_TOOL], {}).text == "offered: search"
    assert complete(model, USER, None, {}).text == "offered: "
