"""The litellm adapter against a real OpenAI-compatible HTTP server on loopback."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from orchestrator.errors import ModelError
from orchestrator.llm.call import (
    INVALID_ARGUMENTS_KEY,
    complete,
    is_retryable,
    parse_arguments,
    to_openai_messages,
    tool_to_openai,
)
from schemas.content import (
    Message,
    RawBlock,
    Role,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from schemas.specs import ToolSpec
from tests.loopback_llm import LoopbackLLM

MODEL = "openai/loopback-model"
USER = [{"role": "user", "content": "Find the weather in Paris"}]
SEARCH = ToolSpec(
    name="search",
    description="Search the web",
    parameters={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackLLM]:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with LoopbackLLM() as loopback:
        yield loopback


def _settings(server: LoopbackLLM) -> dict[str, Any]:
    return {"api_base": server.base_url}


def test_text_streams_in_several_deltas_with_usage(server: LoopbackLLM) -> None:
    server.enqueue_text("It is sunny in Paris today.", usage=(42, 7))
    deltas: list[str] = []

    reply = complete(MODEL, USER, None, _settings(server), on_delta=deltas.append)

    assert reply.text == "It is sunny in Paris today."
    assert len(deltas) > 1 and "".join(deltas) == reply.text
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (42, 7)
    assert reply.usage.cost_usd == 0.0  # unknown model: priced at zero, no error
    assert reply.tool_calls == []
    (sent,) = server.requests
    assert sent["messages"] == USER
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert "tools" not in sent


def test_tool_calls_are_accumulated_from_split_deltas(server: LoopbackLLM) -> None:
    server.enqueue_tool_calls(
        [
            ("search", {"q": "Paris weather"}),
            {"name": "search", "arguments": {"q": "Paris news"}, "id": "call_fixed"},
            ("lookup", "{broken"),
        ],
        text="Let me look.",
    )

    reply = complete(MODEL, USER, [tool_to_openai(SEARCH)], _settings(server))

    assert reply.text == "Let me look."
    assert [(c.tool, c.params) for c in reply.tool_calls] == [
        ("search", {"q": "Paris weather"}),
        ("search", {"q": "Paris news"}),
        ("lookup", {INVALID_ARGUMENTS_KEY: "{broken"}),
    ]
    ids = [c.tool_request_id for c in reply.tool_calls]
    assert ids[1] == "call_fixed" and len(set(ids)) == 3
    assert reply.usage.output_tokens > 0
    assert server.requests[0]["tools"] == [tool_to_openai(SEARCH)]


def test_reasoning_content_becomes_thinking(server: LoopbackLLM) -> None:
    server.enqueue_text("Sunny.", reasoning="The user wants weather, so")

    reply = complete(MODEL, USER, None, _settings(server))

    assert reply.thinking == "The user wants weather, so"
    assert reply.text == "Sunny."


@pytest.mark.parametrize("status", [429, 500, 503])
def test_retryable_http_errors_become_model_error(server: LoopbackLLM, status: int) -> None:
    server.enqueue_error(status, message="slow down please")

    with pytest.raises(ModelError) as caught:
        complete(MODEL, USER, None, _settings(server))

    error = caught.value
    assert error.status == status
    assert "slow down please" in (error.body or "")
    assert is_retryable(error.__cause__)  # type: ignore[arg-type]
    assert len(server.requests) == 1  # no hidden SDK retries: retrying is Chorus's call


def test_client_error_is_not_retryable(server: LoopbackLLM) -> None:
    server.enqueue_error(400, message="bad request body")

    with pytest.raises(ModelError) as caught:
        complete(MODEL, USER, None, _settings(server))

    assert caught.value.status == 400
    assert not is_retryable(caught.value.__cause__)  # type: ignore[arg-type]


def test_errors_then_success_in_queue_order(server: LoopbackLLM) -> None:
    server.enqueue_error(429, n=2)
    server.enqueue_text("finally")

    for _ in range(2):
        with pytest.raises(ModelError):
            complete(MODEL, USER, None, _settings(server))
    assert complete(MODEL, USER, None, _settings(server)).text == "finally"
    assert len(server.requests) == 3 and server.pending == 0


def test_connection_refused_is_retryable_without_status(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    with pytest.raises(ModelError) as caught:
        complete(MODEL, USER, None, {"api_base": f"http://127.0.0.1:{port}/v1"})

    assert caught.value.status is None
    assert is_retryable(caught.value.__cause__)  # type: ignore[arg-type]


def test_calls_in_flight_keep_their_connections_for_later_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with LoopbackLLM(keep_alive=True) as server:
        for _ in range(8):
            server.enqueue_text("one two three", chunk_delay=0.05)

        # When eight calls stream at once
        with ThreadPoolExecutor(8) as threads:
            texts = list(
                threads.map(lambda _: complete(MODEL, USER, None, _settings(server)).text, range(8))
            )
        opened = server.connections

        # Then each had a connection of its own, and later calls reuse them
        assert texts == ["one two three"] * 8
        assert 2 <= opened <= 8
        for _ in range(8):
            server.enqueue_text("again")
            assert complete(MODEL, USER, None, _settings(server)).text == "again"
        assert server.connections == opened


@pytest.mark.parametrize("path", ["auto", "litellm"])
def test_the_first_token_is_timed_on_either_path(
    server: LoopbackLLM, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    # Given a provider silent 0.3 s before it answers, then a piece every
    # 0.05 s: text, then tool calls only, then nothing
    monkeypatch.setenv("CHORUS_MODEL_CLIENT", path)
    server.enqueue_text("one two three", delay=0.3, chunk_delay=0.05)
    server.enqueue_tool_calls([("search", {"q": "x"})], delay=0.3, chunk_delay=0.05)
    server.enqueue_text("")

    # When each is read, the first piece is timed, whatever it is
    for _ in range(2):
        began = time.monotonic()
        reply = complete(MODEL, USER, None, _settings(server))
        assert reply.first_token_at is not None
        assert began + 0.3 <= reply.first_token_at <= time.monotonic()
    # and a reply of nothing streamed nothing
    assert complete(MODEL, USER, None, _settings(server)).first_token_at is None


def test_should_stop_abandons_the_stream(server: LoopbackLLM) -> None:
    server.enqueue_text("one two three four five six seven eight nine ten", chunk_delay=0.02)
    deltas: list[str] = []

    reply = complete(
        MODEL,
        USER,
        None,
        _settings(server),
        on_delta=deltas.append,
        should_stop=lambda: len(deltas) >= 2,
    )

    assert reply.stopped
    assert reply.text == "one two "


def test_on_delta_errors_propagate_unchanged(server: LoopbackLLM) -> None:
    server.enqueue_text("a b c")

    def boom(piece: str) -> None:
        raise LookupError(piece)

    with pytest.raises(LookupError):
        complete(MODEL, USER, None, _settings(server), on_delta=boom)


def test_converted_history_is_what_the_model_receives(server: LoopbackLLM) -> None:
    history = [
        Message(role=Role.USER, content=[TextBlock(text="Weather?"), TextBlock(text="In Paris.")]),
        Message(
            role=Role.ASSISTANT,
            content=[
                ThinkingBlock(thinking="hidden"),
                TextBlock(text="Checking."),
                ToolCallBlock(tool_request_id="c1", tool="search", params={"q": "Paris"}),
                ToolCallBlock(tool_request_id="c2", tool="search", params={"q": "France"}),
                RawBlock(model_kind="x", data={"a": 1}),
            ],
        ),
        Message(
            role=Role.USER,
            content=[
                ToolResultBlock(tool_request_id="c1", tool="search", result={"sky": "blue"}),
                ToolResultBlock(tool_request_id="c2", tool="search", result="boom", is_error=True),
                TextBlock(text="Also, hurry."),
            ],
        ),
        Message(
            role=Role.ASSISTANT, content=[ToolCallBlock(tool_request_id="c3", tool="t", params={})]
        ),
        Message(role=Role.USER, content=[RawBlock(model_kind="x", data=None)]),
    ]
    server.enqueue_text("Sunny.")

    complete(MODEL, to_openai_messages("Be brief.", history), None, _settings(server))

    (sent,) = server.requests
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?\n\nIn Paris."},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "search", "arguments": '{"q": "Paris"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "search", "arguments": '{"q": "France"}'},
                },
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "name": "search",
            "content": json.dumps({"sky": "blue"}),
        },
        {"role": "tool", "tool_call_id": "c2", "name": "search", "content": "boom"},
        {"role": "user", "content": "Also, hurry."},
        {  # no text: no content key
            "role": "assistant",
            "tool_calls": [
                {"id": "c3", "type": "function", "function": {"name": "t", "arguments": "{}"}}
            ],
        },
    ]


def test_non_streaming_requests_are_served_too(server: LoopbackLLM) -> None:
    import litellm

    server.enqueue_tool_calls([("search", {"q": "x"})], usage=(3, 4))

    response = litellm.completion(
        model=MODEL, messages=USER, api_base=server.base_url, max_retries=0
    )

    (tool_call,) = response.choices[0].message.tool_calls
    assert tool_call.function.name == "search"
    assert json.loads(tool_call.function.arguments) == {"q": "x"}
    assert response.usage.prompt_tokens == 3
    assert server.requests[0].get("stream") in (None, False)


def test_empty_queue_answers_a_clear_400(server: LoopbackLLM) -> None:
    with pytest.raises(ModelError, match="no response queued") as caught:
        complete(MODEL, USER, None, _settings(server))
    assert caught.value.status == 400


def test_parse_arguments() -> None:
    assert parse_arguments("") == {}
    assert parse_arguments('{"a": [1]}') == {"a": [1]}
    assert parse_arguments("null") == {INVALID_ARGUMENTS_KEY: "null"}
    assert parse_arguments("{'a': 1}") == {INVALID_ARGUMENTS_KEY: "{'a': 1}"}


def test_read_timeout_is_retryable_without_status(server: LoopbackLLM) -> None:
    server.enqueue_text("too slow", chunk_delay=1.0)

    with pytest.raises(ModelError) as caught:
        complete(MODEL, USER, None, {**_settings(server), "timeout": 0.2})

    assert caught.value.status is None
    assert is_retryable(caught.value.__cause__)  # type: ignore[arg-type]
