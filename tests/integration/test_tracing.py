"""Traces across real worker processes, exported over OTLP/HTTP to a receiver here.

One job of ``traced-lead`` (tests/agents.py): step 0 asks for two ``add``
calls and a ``subagent__echo-child`` call in one batch (a chord over a
threads llm worker and a prefork tools worker), step 1 answers. Its spans
must form one trace, under the span given as ``trace_parent``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from orchestrator import AsyncClient, Client, Settings
from orchestrator.errors import InvalidRequestError
from tests.conftest import WorkerProcess
from tests.fleet import started
from tests.otlp import ReceivedSpan, Receiver, otlp_receiver
from tests.server.conftest import bearer, make_token, start_server

pytestmark = [pytest.mark.integration, pytest.mark.long]

#: The caller's span (fixed: the test ids of parallel sessions must agree;
#: each module run has a receiver of its own).
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@contextmanager
def _traced_fleet(
    settings: Settings, name: str, queues: list[tuple[str, ...]], **env: str
) -> Iterator[tuple[Client, Receiver]]:
    """A client and traced workers on queues of their own (prefix ``-name``),
    exporting to a receiver in this process, ``env`` set for them."""
    own = settings.model_copy(update={"redis_prefix": f"{settings.redis_prefix}-{name}"})
    with otlp_receiver() as receiver, pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "chorus-test")
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        client = Client(own)
        fleet = [WorkerProcess(own, f"{name}-{i}", *args) for i, args in enumerate(queues)]
        try:
            with started(client, fleet):
                yield client, receiver
        finally:
            client.close()


@pytest.fixture(scope="module")
def traced(settings: Settings) -> Iterator[tuple[Client, Receiver]]:
    """Two traced workers: llm+control threads, tools prefork."""
    with _traced_fleet(
        settings,
        "trace",
        [
            ("-Q", "llm,control", "-P", "threads", "-c", "4"),
            ("-Q", "tools", "-P", "prefork", "-c", "2"),
        ],
    ) as fleet:
        yield fleet


def _wait_for(receiver: Receiver, trace_id: str, count: int) -> list[ReceivedSpan]:
    """The trace's spans once ``count`` invoke_agent, chat and execute_tool spans
    came, and the parent of each came too (a parent ends after its children, so
    it can reach the receiver in a later export)."""
    deadline = time.monotonic() + 60
    while True:
        spans = [s for s in receiver.received() if s.trace_id == trace_id]
        main = [s for s in spans if s.name.split()[0] in ("invoke_agent", "chat", "execute_tool")]
        ids = {s.span_id for s in spans} | {CALLER_SPAN}
        whole = all(s.parent_id in ids for s in spans)
        if (len(main) >= count and whole) or time.monotonic() > deadline:
            return spans
        time.sleep(0.2)


def _one(spans: list[ReceivedSpan], name: str, **attributes: object) -> ReceivedSpan:
    found = [
        s
        for s in spans
        if s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())
    ]
    assert len(found) == 1, (name, attributes, [(s.name, s.attributes) for s in spans])
    return found[0]


def test_one_job_is_one_connected_trace(traced: tuple[Client, Receiver]) -> None:
    client, receiver = traced
    # Given a job submitted under a caller's span (an HTTP request's, say)
    job = client.submit("traced-lead", "go", trace_parent=f"00-{CALLER_TRACE}-{CALLER_SPAN}-01")
    # When it runs: two tools and a subagent in one batch, then an answer
    assert job.result(timeout=60).startswith("results:")
    # 2 turns + 3 model calls + 3 tool calls
    spans = _wait_for(receiver, CALLER_TRACE, 8)

    # Then every span is in the caller's trace, and each one's parent is
    # another span of it, or the caller's span for the job's root
    ids = {s.span_id for s in spans}
    assert len(ids) == len(spans), "span ids are unique"
    for span in spans:
        assert span.parent_id in ids or span.parent_id == CALLER_SPAN, span
        assert span.service == "chorus-test"
        assert span.end_ns >= span.start_ns > 0

    root = _one(spans, "invoke_agent traced-lead")
    assert root.parent_id == CALLER_SPAN
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.conversation.id"] == job.conversation_id
    assert root.attributes["chorus.job.id"] == job.id
    assert root.attributes["chorus.turn.status"] == "completed"
    step0 = _one(spans, "step 0", **{"chorus.turn.id": job.id})
    step1 = _one(spans, "step 1", **{"chorus.turn.id": job.id})
    assert step0.parent_id == step1.parent_id == root.span_id
    assert step0.attributes["chorus.tool_calls"] == 3

    # the model calls: GenAI semantic conventions, no contents (not opted in)
    chats = [s for s in spans if s.name == "chat traced-lead"]
    assert sorted(s.parent_id for s in chats) == sorted([step0.span_id, step1.span_id])
    for chat in chats:
        assert chat.kind == 3  # CLIENT
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.provider.name"] == "scripted"
        assert chat.attributes["gen_ai.request.model"] == "traced-lead"
        assert chat.attributes["gen_ai.conversation.id"] == job.conversation_id
        assert chat.attributes["gen_ai.usage.input_tokens"] > 0
        assert chat.attributes["gen_ai.usage.output_tokens"] >= 0
        assert isinstance(chat.attributes["gen_ai.response.finish_reasons"], list)
        assert "chorus.cost_usd" in chat.attributes
        assert "gen_ai.input.messages" not in chat.attributes

    # the tool batch: each call a child of step 0, with its tool and call id
    adds = [s for s in spans if s.name == "execute_tool add"]
    assert len(adds) == 2
    call = _one(spans, "execute_tool subagent__echo-child")
    for tool in [*adds, call]:
        assert tool.parent_id == step0.span_id
        assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
        assert tool.attributes["gen_ai.tool.call.id"]
        assert tool.status_code != 2
    assert {s.attributes["gen_ai.tool.name"] for s in adds} == {"add"}
    assert call.attributes["gen_ai.tool.type"] == "agent"

    # the subagent's turn is a child of the call that started it
    child = _one(spans, "invoke_agent echo-child")
    assert child.parent_id == call.span_id
    child_step = _one(spans, "step 0", **{"chorus.turn.id": child.attributes["chorus.turn.id"]})
    assert child_step.parent_id == child.span_id
    assert _one(spans, "chat echo-child").parent_id == child_step.span_id

    # the advance that ended step 0's batch (on the control queue) is under step 0
    advances = [s for s in spans if s.name == "chorus.advance"]
    assert advances and step0.span_id in {s.parent_id for s in advances}


def test_a_job_without_a_trace_parent_has_its_own_trace(traced: tuple[Client, Receiver]) -> None:
    client, receiver = traced
    job = client.submit("traced-lead", "go")
    job.result(timeout=60)
    root = _root_span(receiver, job.id)
    assert root.parent_id == ""
    wanted = {"step 0", "step 1", "chat traced-lead", "execute_tool add", "invoke_agent echo-child"}
    deadline = time.monotonic() + 60  # spans of one trace arrive in several exports
    while True:
        names = {s.name for s in receiver.received() if s.trace_id == root.trace_id}
        if names >= wanted or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert names >= wanted


@pytest.mark.parametrize("value", ["", "nope", f"00-{'0' * 32}-{CALLER_SPAN}-01", "ff-" + "1" * 49])
def test_a_trace_parent_that_is_not_one_is_refused(
    traced: tuple[Client, Receiver], value: str
) -> None:
    client, _ = traced
    with pytest.raises(InvalidRequestError) as refused:
        client.submit("traced-lead", "go", trace_parent=value)
    assert refused.value.fields == ["trace_parent"]


def _root_span(receiver: Receiver, job_id: str) -> ReceivedSpan:
    """The job's root span (``invoke_agent``), once it arrived."""
    deadline = time.monotonic() + 60
    while True:
        roots = [
            s
            for s in receiver.received()
            if s.name == "invoke_agent traced-lead" and s.attributes["chorus.job.id"] == job_id
        ]
        if roots or time.monotonic() > deadline:
            assert len(roots) == 1, roots
            return roots[0]
        time.sleep(0.2)


def test_an_http_submit_joins_the_requests_traceparent(
    traced: tuple[Client, Receiver], tmp_path: Path
) -> None:
    client, receiver = traced
    # Given `chorus server` on the traced fleet, and a request under a caller's span
    server = start_server(client.settings, tmp_path / "server.log")
    headers = bearer(make_token(client, "acme", "submit", "traced-http"))
    trace, span = "5bf92f3577b34da6a3ce929d0e0e4737", "10f067aa0ba902b8"
    try:
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
            jobs = []
            for parent in (f"00-{trace}-{span}-01", "not-a-traceparent"):
                # When a job is submitted with that traceparent header
                made = http.post(
                    "/v1/jobs",
                    json={"agent": "traced-lead", "input": "go"},
                    headers={"traceparent": parent},
                )
                assert made.status_code == 201, made.text
                jobs.append(made.json()["job_id"])
                done = http.get(f"/v1/jobs/{jobs[-1]}/result", params={"wait": 30})
                assert done.status_code == 200, done.text
    finally:
        server.proc.terminate()
        server.proc.wait(15)

    # Then the job's root span is a child of the request's span; an invalid
    # header is ignored (W3C Trace Context): that job has a trace of its own
    joined = _root_span(receiver, jobs[0])
    assert (joined.trace_id, joined.parent_id) == (trace, span)
    own = _root_span(receiver, jobs[1])
    assert own.parent_id == "" and own.trace_id != trace


def test_an_async_submit_joins_the_trace_given(traced: tuple[Client, Receiver]) -> None:
    client, receiver = traced
    trace, span = "5bf92f3577b34da6a3ce929d0e0e4738", "10f067aa0ba902b9"

    async def submit() -> str:
        async with AsyncClient(client.settings) as ac:
            # Given a job submitted from asyncio with a caller's traceparent
            job = await ac.submit("traced-lead", "go", trace_parent=f"00-{trace}-{span}-01")
            assert (await job.result(timeout=60)).startswith("results:")
            # and a bad one refused at once, naming the field
            with pytest.raises(InvalidRequestError) as refused:
                await ac.submit("traced-lead", "go", trace_parent="00-nope")
            assert refused.value.fields == ["trace_parent"]
            return job.id

    # Then the job's root span is a child of the caller's span
    joined = _root_span(receiver, asyncio.run(submit()))
    assert (joined.trace_id, joined.parent_id) == (trace, span)


#: A credential the content test's worker holds: it must never reach a span.
TRACE_SECRET = "Sk-trace-Secret-4242"


def test_message_contents_are_on_spans_only_when_opted_in_and_redacted(
    settings: Settings,
) -> None:
    """``CHORUS_TRACE_CONTENT=true`` adds the messages, tool definitions, and
    each tool call's arguments and result (the spans of the fleet above,
    without it, carry none: test_one_job_is_one_connected_trace); a
    credential of the worker's in the input is masked."""
    with _traced_fleet(
        settings,
        "trace-content",
        [("-Q", "llm,control,tools", "-P", "threads", "-c", "4")],
        CHORUS_TRACE_CONTENT="true",
        CHORUS_TEST_TRACE_API_KEY=TRACE_SECRET,
    ) as (client, receiver):
        trace = "6bf92f3577b34da6a3ce929d0e0e4739"
        job = client.submit(
            "traced-lead", f"go with {TRACE_SECRET}", trace_parent=f"00-{trace}-{CALLER_SPAN}-01"
        )
        assert job.result(timeout=60).startswith("results:")
        spans = _wait_for(receiver, trace, 8)

    chats = [s for s in spans if s.name == "chat traced-lead"]
    assert len(chats) == 2
    first = min(chats, key=lambda s: s.start_ns)
    asked = first.attributes["gen_ai.input.messages"]
    assert "go with ***" in asked and TRACE_SECRET not in asked
    assert '"add"' in first.attributes["gen_ai.tool.definitions"]
    answered = first.attributes["gen_ai.output.messages"]
    assert '"tool_call"' in answered and '"subagent__echo-child"' in answered
    adds = sorted(
        (s for s in spans if s.name == "execute_tool add"),
        key=lambda s: s.attributes["gen_ai.tool.call.arguments"],
    )
    assert [
        (s.attributes["gen_ai.tool.call.arguments"], s.attributes["gen_ai.tool.call.result"])
        for s in adds
    ] == [('{"a": 1, "b": 2}', "3"), ('{"a": 3, "b": 4}', "7")]
    assert not any(TRACE_SECRET in str(s.attributes) for s in spans)
