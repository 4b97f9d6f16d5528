"""Hostile input: only Chorus errors, naming the field, and no wedged
conversation. Examples first, then property-based tests (hypothesis)."""

from __future__ import annotations

import datetime
import json
import math
from typing import Any

import pytest

from orchestrator import ChorusError, Client, InvalidRequestError, Settings
from schemas import AgentSpec, Budget
from tests.conftest import tool_calls

pytestmark = pytest.mark.integration


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def quick_spec(**changes: Any) -> AgentSpec:
    return AgentSpec(name="sec-inline", model="scripted/quick", **changes)


SUBMITS: list[tuple[dict[str, Any], str]] = [
    ({"input": "a\x00b"}, "input"),
    ({"input": "a\ud800b"}, "input"),
    ({"input": "x" * 200_001}, "input"),
    ({"context_data": {"x": object()}}, "context_data"),
    ({"context_data": {"when": datetime.datetime.now(datetime.UTC)}}, "context_data"),
    ({"context_data": {"tags": {1, 2}}}, "context_data"),
    ({"context_data": {"x": math.nan}}, "context_data"),
    ({"context_data": {"x": [math.inf]}}, "context_data"),
    ({"context_data": {"x": "a\x00b"}}, "context_data"),
    ({"context_data": {"a\x00": 1}}, "context_data"),
    ({"context_data": nested(300)}, "context_data"),
    ({"context_data": {"n": 10**5000}}, "context_data"),
    ({"idempotency_key": "k\x00"}, "idempotency_key"),
    ({"conversation_id": "c\x00"}, "conversation_id"),
    ({"budget": Budget(cost_usd=math.inf)}, "budget"),
    ({"agent": quick_spec(system="be\x00nice")}, "agent"),
    ({"agent": quick_spec(model_settings={"temperature": math.nan})}, "agent"),
    ({"agent": quick_spec(model_settings={"x": object()})}, "agent"),
    ({"agent": quick_spec(model_settings={"metadata": nested(300)})}, "agent"),
    ({"agent": {"name": "x y", "model": "m"}}, "agent.AgentSpec.name"),
]


@pytest.mark.parametrize(("changes", "field"), SUBMITS)
def test_hostile_submits_are_refused_naming_the_field(
    client: Client, changes: dict[str, Any], field: str
) -> None:
    request = {"agent": "quick", "input": "hi", **changes}
    with pytest.raises(InvalidRequestError) as caught:
        client.submit(request.pop("agent"), request.pop("input"), **request)
    assert field in caught.value.fields, caught.value
    assert field.split(".")[0] in str(caught.value)


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": [{"type": "text", "text": "a\x00b"}]}],
        [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}],
        [
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_call", "tool_request_id": "c", "tool": "t", "params": nested(99)}
                ],
            }
        ],
        [
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_request_id": "c",
                        "tool": "t",
                        "result": datetime.date.today(),
                    }
                ],
            }
        ],
        [{"role": "user", "content": [{"type": "raw", "model_kind": "x", "data": math.inf}]}],
    ],
)
def test_hostile_loads_are_refused_naming_the_field(
    client: Client, workers: Any, messages: list[dict[str, Any]]
) -> None:
    job = client.submit("quick", "hello")
    job.result(timeout=60)
    with pytest.raises(InvalidRequestError) as caught:
        client.load(job.conversation_id, messages)
    assert caught.value.fields == ["messages"]
    # the conversation is unharmed
    again = client.submit("quick", "again", conversation_id=job.conversation_id)
    assert again.result(timeout=60) == "ok: again"


def test_hostile_ids_name_no_conversation(client: Client) -> None:
    for call in (
        lambda: client.send("c\x00", "hi"),
        lambda: client.load("c\ud800", []),
        lambda: client.history("c\x00"),
        lambda: client.usage("c\x00"),
        lambda: client.fork("c\x00"),
        lambda: client.clear("c\x00"),
        lambda: client.checkpoint("c\x00"),
        lambda: client.clear_queue("c\x00"),
        lambda: client.job("j\x00"),
    ):
        with pytest.raises(ChorusError):
            call()


def test_send_refuses_nul_naming_the_text(client: Client, workers: Any) -> None:
    job = client.submit("quick", "hello")
    job.result(timeout=60)
    with pytest.raises(InvalidRequestError) as caught:
        client.send(job.conversation_id, "a\x00b")
    assert caught.value.fields == ["text"]


def test_the_input_cap_is_the_setting_and_can_be_raised(
    settings: Settings, client: Client, workers: Any
) -> None:
    text = "x" * 250_000
    with pytest.raises(InvalidRequestError, match="CHORUS_MAX_INPUT_CHARS"):
        client.submit("quick", text)
    roomy = Client(settings.model_copy(update={"max_input_chars": 300_000}))
    try:
        job = roomy.submit("quick", text)
        assert job.result(timeout=60) == f"ok: {text}"
        entry = roomy.send(job.conversation_id, "y" * 260_000)
        assert entry
    finally:
        roomy.close()


def test_nul_from_a_model_and_a_tool_is_stored_as_replacement(client: Client, workers: Any) -> None:
    # Given arguments carrying NUL, a lone surrogate and NaN, echoed back by
    # the tool, and a final answer with a NUL of its own
    arguments = '{"value": ["a\\u0000b", "\\ud800", NaN]}'
    job = client.submit("sec-hostile-args", arguments)

    # Then the turn completes, and what was stored has U+FFFD in their place
    answer = job.result(timeout=60)
    assert answer.startswith("saw\ufffd: ")
    [call] = tool_calls(client, job.id)
    assert call.params == {"value": ["a\ufffdb", "\ufffd", "NaN"]}
    assert (call.is_error, call.result) == (False, ["a\ufffdb", "\ufffd", "NaN"])


def test_too_deep_tool_arguments_are_an_error_result(client: Client, workers: Any) -> None:
    job = client.submit("sec-hostile-args", json.dumps({"value": nested(200)}))
    job.result(timeout=60)
    [call] = tool_calls(client, job.id)
    assert call.is_error and "not a JSON object" in str(call.result)
