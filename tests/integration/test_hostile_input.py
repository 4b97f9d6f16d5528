"""Hostile input: only Chorus errors, naming the field, and no wedged
conversation. Examples first, then property-based tests (hypothesis)."""

from __future__ import annotations

import contextlib
import datetime
import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from orchestrator import ChorusError, Client, InvalidRequestError, JobFailedError, Settings
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


def test_send_and_load_refuse_what_is_not_text_or_messages(client: Client, workers: Any) -> None:
    job = client.submit("quick", "hello")
    job.result(timeout=60)
    for text in ("a\x00b", "\ud800", "", None, 42):
        with pytest.raises(InvalidRequestError) as caught:
            client.send(job.conversation_id, text)  # type: ignore[arg-type]
        assert caught.value.fields == ["text"]
    with pytest.raises(InvalidRequestError) as refused:
        client.load(job.conversation_id, None)  # type: ignore[arg-type]
    assert refused.value.fields == ["messages"]


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
    # the tool, and a final answer with a NUL and a lone surrogate of its own
    arguments = '{"value": ["a\\u0000b", "\\ud800", NaN]}'
    job = client.submit("sec-hostile-args", arguments)

    # Then the turn completes, and what was stored has U+FFFD in their place
    answer = job.result(timeout=60)
    assert answer.startswith("saw\ufffd\ufffd: ")
    [call] = tool_calls(client, job.id)
    assert call.params == {"value": ["a\ufffdb", "\ufffd", "NaN"]}
    assert (call.is_error, call.result) == (False, ["a\ufffdb", "\ufffd", "NaN"])


def test_too_deep_tool_arguments_are_an_error_result(client: Client, workers: Any) -> None:
    job = client.submit("sec-hostile-args", json.dumps({"value": nested(200)}))
    job.result(timeout=60)
    [call] = tool_calls(client, job.id)
    assert call.is_error and "not a JSON object" in str(call.result)


# -- property-based: whatever comes in, only Chorus errors come out ------------

PROPERTY = hsettings(
    max_examples=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

#: Every code point, surrogates and NUL included.
ANY_CHAR = st.characters(exclude_categories=[])
#: Every code point a job's input may hold.
STORABLE_CHAR = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")
hostile_text = st.one_of(
    st.text(ANY_CHAR, max_size=50),
    st.sampled_from(["a\x00b", "\ud800", "\udfff x", "", " ", "x" * 250_000, "{", "\x00" * 10]),
)
json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**400, max_value=10**401),
    st.floats(),
    hostile_text,
)
not_json = st.one_of(
    st.builds(object),
    st.datetimes(),
    st.sets(st.integers(), max_size=3),
    st.just(b"bytes"),
    st.just(math.nan),
    st.integers(min_value=60, max_value=400).map(nested),
)
hostile_value = st.recursive(
    st.one_of(json_leaf, not_json),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(ANY_CHAR, max_size=5), inner, max_size=3),
    ),
    max_leaves=8,
)
hostile_context = st.one_of(
    st.dictionaries(st.text(ANY_CHAR, max_size=8), hostile_value, max_size=4),
    st.dictionaries(st.integers(), st.integers(), min_size=1, max_size=2),
)
setting_keys = st.one_of(
    st.sampled_from(
        ["api_key", "max_tokens", "temperature", "headers", "aws_session_token", "metadata"]
    ),
    st.text(ANY_CHAR, max_size=10),
)
hostile_spec = st.builds(
    dict,
    name=st.one_of(st.just("sec-prop"), st.text(ANY_CHAR, max_size=70)),
    model=st.just("scripted/quick"),
    system=hostile_text,
    model_settings=st.dictionaries(setting_keys, hostile_value, max_size=3),
).map(lambda fields: _spec_or_fields(fields))
hostile_agent = st.one_of(
    st.just("quick"),
    st.text(ANY_CHAR, max_size=70),
    hostile_spec,
)


def _spec_or_fields(fields: dict[str, Any]) -> AgentSpec | dict[str, Any]:
    """An AgentSpec when pydantic takes the fields (Chorus must then judge
    them), else the raw fields (Chorus must refuse them as data)."""
    try:
        return AgentSpec(**fields)
    except ValueError:
        return fields


def _ends(job: Any) -> None:
    """An accepted job must end, completed or failed, within a bound."""
    with contextlib.suppress(JobFailedError):
        job.result(timeout=60)


def _never_wedged(client: Client) -> None:
    assert client.submit("quick", "still fine?").result(timeout=60) == "ok: still fine?"


def test_submit_raises_only_chorus_errors(client: Client, workers: Any) -> None:
    @PROPERTY
    @given(agent=hostile_agent, text=hostile_text, context=hostile_context, key=hostile_text)
    def prop(agent: Any, text: str, context: dict[Any, Any], key: str) -> None:
        try:
            job = client.submit(agent, text, context_data=context, idempotency_key=key or None)
        except ChorusError:
            return
        _ends(job)

    prop()
    _never_wedged(client)


message_blocks = st.one_of(
    st.builds(dict, type=st.just("text"), text=hostile_text),
    st.builds(dict, type=st.just("thinking"), thinking=hostile_text),
    st.builds(
        dict,
        type=st.just("tool_call"),
        tool_request_id=hostile_text,
        tool=hostile_text,
        params=st.dictionaries(st.text(ANY_CHAR, max_size=5), hostile_value, max_size=3),
    ),
    st.builds(
        dict,
        type=st.just("tool_result"),
        tool_request_id=hostile_text,
        tool=hostile_text,
        result=hostile_value,
        is_error=st.booleans(),
    ),
    st.builds(dict, type=st.just("raw"), model_kind=hostile_text, data=hostile_value),
    hostile_value,
)
hostile_messages: st.SearchStrategy[list[Any]] = st.lists(
    st.one_of(
        st.builds(
            dict,
            role=st.sampled_from(["user", "assistant", "system", "\x00"]),
            content=st.lists(message_blocks, max_size=3),
        ),
        hostile_value,
    ),
    max_size=4,
)


def test_load_raises_only_chorus_errors(client: Client, workers: Any) -> None:
    first = client.submit("quick", "hello")
    _ends(first)
    conversation = first.conversation_id

    @PROPERTY
    @given(
        messages=st.one_of(hostile_messages, hostile_value),
        target=st.one_of(st.just(conversation), hostile_text, json_leaf),
    )
    def prop(messages: list[Any], target: str) -> None:
        try:
            client.load(target, messages)
        except ChorusError:
            return

    prop()
    # the conversation takes a normal turn after whatever was loaded
    job = client.submit("quick", "after loads", conversation_id=conversation)
    _ends(job)
    _never_wedged(client)


hostile_arguments = st.one_of(
    st.builds(
        lambda v: json.dumps({"value": v}),
        st.recursive(json_leaf, lambda i: st.lists(i, max_size=3), max_leaves=6),
    ),
    st.builds(json.dumps, st.dictionaries(st.text(ANY_CHAR, max_size=5), json_leaf, max_size=3)),
    st.integers(min_value=60, max_value=3000).map(lambda d: "[" * d + "]" * d),
    st.integers(min_value=60, max_value=300).map(lambda d: json.dumps({"value": nested(d)})),
    st.text(STORABLE_CHAR, min_size=1, max_size=30),
    st.sampled_from(['{"value": NaN}', '{"value": Infinity}', '{"value": "\\u0000"}', "[]", "1"]),
)


def test_tool_arguments_never_break_a_turn(client: Client, workers: Any) -> None:
    @hsettings(PROPERTY, max_examples=20)
    @given(arguments=hostile_arguments)
    def prop(arguments: str) -> None:
        # an input over the cap is refused at submit (its own test above);
        # the 250,000-character leaf can make one
        assume(len(arguments) <= client.settings.max_input_chars)
        job = client.submit("sec-hostile-args", arguments)
        job.result(timeout=60)  # the tool's result or its error, then an answer

    prop()
    _never_wedged(client)
