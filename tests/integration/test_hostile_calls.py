"""Every public entry point, not only ``submit``: hostile arguments to any
method of ``Client`` and ``Job``, and to the CLI, raise an
``InvalidRequestError`` naming the field (a ``UserError`` at worst, exit
status 2 for the CLI), never a raw driver error or a
``ServiceUnavailableError`` telling the caller to retry."""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator import Client, InvalidRequestError, Job, Settings, UserError
from tests.conftest import worker_env
from tests.integration.test_hostile_input import (
    ANY_CHAR,
    PROPERTY,
    hostile_context,
    hostile_messages,
    hostile_text,
    json_leaf,
)
from tests.test_cli import run

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def finished(client: Client, workers: Any) -> Job:
    job = client.submit("quick", "hello")
    job.result(timeout=60)
    return job


CONVERSATION_METHODS = (
    "clear_queue",
    "checkpoint",
    "fork",
    "clear",
    "usage",
    "plan",
    "history",
)


def _cases(client: Client, job: Job) -> list[tuple[Callable[[], Any], str]]:
    conv = job.conversation_id
    by_id: list[tuple[Callable[[], Any], str]] = []
    for method in CONVERSATION_METHODS:
        call = getattr(client, method)
        by_id += [
            (lambda call=call: call("c\x00"), "conversation_id"),
            (lambda call=call: call(None), "conversation_id"),
            (lambda call=call: call("c" * 65), "conversation_id"),
        ]
    return [
        # the four
        (lambda: client.cancel("ab\x00cd"), "job_id"),
        (lambda: client.cancel("ab\ud800cd"), "job_id"),
        (lambda: client.tool_output(conv, "a\x00b"), "handle"),
        (lambda: job.events(since=2**70), "since"),
        # and their neighbours
        (lambda: client.cancel(""), "job_id"),
        (lambda: client.job(42), "job_id"),
        (lambda: client.job("j" * 65), "job_id"),
        (lambda: client.job("j\ud800"), "job_id"),
        (lambda: client.tool_output(conv, 7), "handle"),
        (lambda: client.tool_output(conv, "h\ud800"), "handle"),
        (lambda: client.job_for_message(conv, "1-0\x00"), "entry_id"),
        (lambda: client.job_for_message(conv, 42), "entry_id"),
        (lambda: client.send("c\ud800", "hi"), "conversation_id"),
        (lambda: client.load("c\x00", []), "conversation_id"),
        (lambda: job.events(since=-1), "since"),
        (lambda: job.events(since="5"), "since"),
        (lambda: job.events(since=1.5), "since"),
        (lambda: job.events(timeout=math.nan), "timeout"),
        (lambda: job.events(deltas="no"), "deltas"),  # type: ignore[arg-type]
        (lambda: job.result(timeout=-1), "timeout"),
        (lambda: job.result(timeout="10"), "timeout"),  # type: ignore[arg-type]
        *by_id,
    ]


def test_every_entry_point_refuses_malformed_input_naming_the_field(
    client: Client, finished: Job
) -> None:
    for call, field in _cases(client, finished):
        with pytest.raises(InvalidRequestError) as caught:
            call()
        assert caught.value.fields == [field], caught.value
        assert field in str(caught.value)
    # and nothing was harmed
    assert finished.result(timeout=5) == "ok: hello"
    assert [e.seq for e in finished.events(since=2**63 - 1)] == []


# -- property-based: every method of Client and Job ----------------------------

hostile_id = st.one_of(
    hostile_text,
    json_leaf,
    st.text(ANY_CHAR, min_size=60, max_size=70),
    st.lists(st.text(max_size=3), max_size=2),
)
hostile_number = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**62, max_value=2**80),
    st.just(10**400),
    st.floats(),
    st.floats(min_value=0, max_value=2),
    hostile_text,
)


def _client_calls(job: Job) -> st.SearchStrategy[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    ids = st.one_of(st.just(job.id), st.just(job.conversation_id), hostile_id)

    def call(name: str, *args: st.SearchStrategy[Any], **kwargs: st.SearchStrategy[Any]) -> Any:
        return st.tuples(st.just(name), st.tuples(*args), st.fixed_dictionaries(kwargs))

    return st.one_of(
        call("job", ids),
        call("send", ids, hostile_text),
        call("send", ids, st.just("hi"), context_data=hostile_context, priority=hostile_number),
        call("job_for_message", ids, st.one_of(hostile_id, st.just("1-0"))),
        call("cancel", ids),
        call("load", ids, st.one_of(hostile_messages, st.just([]))),
        call("tool_output", ids, ids),
        *(call(name, ids) for name in CONVERSATION_METHODS),
        call("job.events", since=hostile_number, timeout=hostile_number, deltas=hostile_id),
        call("job.result", timeout=hostile_number),
        call("job.status"),
        call("job.plan"),
        call("job.cancel"),
    )


def test_every_client_method_raises_only_user_errors(
    client: Client, workers: Any, finished: Job
) -> None:
    # a fresh job of its own (the calls may clear, load or cancel it)
    job = client.submit("quick", "target")
    job.result(timeout=60)

    @PROPERTY
    @given(call=_client_calls(job))
    def prop(call: tuple[str, tuple[Any, ...], dict[str, Any]]) -> None:
        name, args, kwargs = call
        target: Any = job if name.startswith("job.") else client
        method = getattr(target, name.removeprefix("job."))
        try:
            value = method(*args, **kwargs)
            if name == "job.events":
                list(value)
        except UserError:
            return
        except TimeoutError:
            assert "timeout" in kwargs  # only when a bound was given

    prop()
    assert client.submit("quick", "still fine?").result(timeout=60) == "ok: still fine?"


# -- the CLI -------------------------------------------------------------------


@pytest.fixture
def cli(client: Client, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[list[str]], int]]:
    """The CLI in this process (its commands on the session's client): the
    exit status of ``chorus ARGS``; an exception escaping ``main`` fails."""
    from orchestrator import cli as cli_module

    monkeypatch.setattr(cli_module, "_client", lambda settings=None: client)

    def invoke(args: list[str]) -> int:
        monkeypatch.setattr(sys, "argv", ["chorus", *args])
        try:
            cli_module.main()
        except SystemExit as exc:
            return int(exc.code or 0)
        return 0

    yield invoke


#: What an argument can hold: anything but NUL (argv cannot carry it); bytes
#: that are not UTF-8 arrive as lone surrogates (U+DC80-U+DCFF).
ARGV_CHAR = st.characters(exclude_categories=[], exclude_characters="\x00")
argv_text = st.one_of(
    st.text(ARGV_CHAR, max_size=40),
    st.sampled_from(["\udcff", "ab\udc80cd", "", "-", "--", "x" * 300, "0" * 32]),
)
context_json = st.one_of(
    argv_text,
    st.sampled_from(
        ['{"x": NaN}', '{"x": Infinity}', '{"a\\u0000": 1}', '{"x": "\\ud800"}', "[" * 5000]
    ),
    st.integers(min_value=60, max_value=5000).map(lambda d: '{"a":' * d + "1" + "}" * d),
)


def _cli_commands(job: Job) -> st.SearchStrategy[list[str]]:
    ids = st.one_of(st.just(job.id), st.just(job.conversation_id), argv_text)
    numbers = st.one_of(
        st.integers().map(str),
        st.sampled_from([str(2**70), str(-(2**70)), "1e3", "nan"]),
        argv_text,
    )
    options = st.lists(
        st.one_of(
            st.tuples(st.just("--conversation"), ids),
            st.tuples(st.just("--idempotency-key"), argv_text),
            st.tuples(st.just("--context-data"), context_json),
            st.tuples(st.just("--priority"), numbers),
        ),
        max_size=3,
    ).map(lambda pairs: [part for pair in pairs for part in pair])
    agents = st.one_of(st.just("quick"), argv_text)
    return st.one_of(
        st.tuples(st.just("submit"), agents, argv_text)
        .map(list)
        .flatmap(lambda head: options.map(lambda tail: head + tail)),
        st.tuples(st.just("status"), ids).map(list),
        st.tuples(st.just("events"), ids, st.just("--since"), numbers).map(list),
        st.tuples(st.just("cancel"), ids).map(list),
        st.tuples(st.just("send"), ids, argv_text).map(list),
    )


def test_the_cli_exits_0_or_2_on_any_arguments(
    client: Client, workers: Any, cli: Callable[[list[str]], int]
) -> None:
    job = client.submit("quick", "cli target")
    job.result(timeout=60)

    @PROPERTY
    @given(args=_cli_commands(job))
    def prop(args: list[str]) -> None:
        with contextlib.redirect_stdout(sys.stderr):
            assert cli(args) in (0, 2), args

    prop()
    assert client.submit("quick", "still fine?").result(timeout=60) == "ok: still fine?"


def test_an_argument_that_is_not_utf8_is_a_one_line_error(settings: Settings) -> None:
    # Given bytes that are not UTF-8 as the job id (Python reads them as
    # lone surrogates), from a real shell
    out = run(["cancel", "ab\udcffcd"], worker_env(settings))

    # Then the CLI names the field in one line and exits 2, no traceback
    assert out.returncode == 2, out.stdout + out.stderr
    assert "job_id: contains a lone surrogate" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_spec_or_budget_built_without_validation_is_refused_naming_the_field(
    client: Client,
) -> None:
    # model_copy(update=...) and model_construct skip validation: submit
    # raised a raw TypeError or AttributeError, or stored the spec, and then
    # every step of the conversation (and send() to it) failed validating it
    from schemas import AgentSpec, Budget

    spec = AgentSpec(name="hostile-copy", model="scripted/quick")
    for agent, field in [
        (spec.model_copy(update={"model": 123}), "agent.AgentSpec.model"),
        (spec.model_copy(update={"model_settings": "x"}), "agent.AgentSpec.model_settings"),
        (spec.model_copy(update={"tools": (1,)}), "agent.AgentSpec.tools.0"),
        (spec.model_copy(update={"max_steps": 2**80}), "agent.AgentSpec.max_steps"),
        (AgentSpec.model_construct(name="hostile-copy"), "agent.AgentSpec.model"),
    ]:
        with pytest.raises(InvalidRequestError) as caught:
            client.submit(agent, "hi")
        assert field in caught.value.fields
    budget = Budget(tokens=5).model_copy(update={"tokens": -5})
    with pytest.raises(InvalidRequestError) as caught:
        client.submit("quick", "hi", budget=budget)
    assert caught.value.fields == ["budget.tokens"]
    with pytest.raises(InvalidRequestError) as caught:
        client.send("c1", "hi", budget=budget)
    assert caught.value.fields == ["budget.tokens"]
