"""The harness itself: the embedded store, the inline dispatcher, the
in-process models, and the errors a fleet raises."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from orchestrator import (
    Agent,
    ConfigurationError,
    ConversationNotFound,
    InvalidRequestError,
    JobFailedError,
    ModelError,
    UnknownAgentError,
    tool,
)
from orchestrator.engine.actions import Dequeue, RunAdvance, RunStep, ToolTask
from orchestrator.testing import FunctionModel, Harness, ModelRequest, Reply, ScriptedModel, call
from schemas import EventName, RetryPolicy, TurnStatus
from tests.conftest import tool_calls

HERE = __name__


@tool
def h_add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


@tool
def h_note(label: str) -> str:
    """Note a label.

    Args:
        label: what to note.
    """
    return label


@tool(parallelizable=False)
def h_note_alone(label: str) -> str:
    """Note a label, never beside another call.

    Args:
        label: what to note.
    """
    return label


Agent("h-calculator", "test/calculator", system="You add.", tools=[h_add])
Agent("h-ordering", "test/ordering", tools=[h_note, h_note_alone])
Agent("h-retrying", "test/retrying", retry=RetryPolicy(initial_delay=0.3, jitter=0))
Agent("h-plain", "test/plain")


def calculator(request: ModelRequest) -> Reply | str:
    if not request.tool_results:
        return Reply.call(call("h_add", a=2, b=3), text="Let me add. ")
    return f"2 + 3 = {request.tool_results[0]}"


@pytest.fixture
def embedded() -> Iterator[Harness]:
    """A harness on its own SQLite file and embedded Redis."""
    with Harness(modules=[HERE], model=FunctionModel(calculator)) as h:
        yield h


def test_a_function_model_runs_a_tool_loop(embedded: Harness) -> None:
    # Given a model function that calls `add`, then answers with its result
    model = embedded.runtime.model
    assert isinstance(model, FunctionModel)

    # When a job runs
    job = embedded.client.submit("h-calculator", "2+3?")

    # Then it has finished when submit returns, with the tool's result
    assert job.status().status is TurnStatus.COMPLETED
    assert job.result() == "2 + 3 = 5"
    # the model was asked twice: with the tool offered, then with its result
    first, second = model.requests
    assert first.model == "test/calculator" and first.system == "You add."
    assert first.tool_names == ["h_add"] and first.user_text == "2+3?"
    assert second.tool_results == ["5"] and second.steps == 1
    # and the events are a fleet's: the call requested, started, completed
    names = [e.name for e in embedded.events(job)]
    assert names[0] is EventName.TURN_STARTED and names[-1] is EventName.TURN_COMPLETED
    assert names.count(EventName.LLM_COMPLETED) == 2
    tool_events = [EventName.TOOL_REQUESTED, EventName.TOOL_STARTED, EventName.TOOL_COMPLETED]
    assert [n for n in names if n in tool_events] == tool_events
    # the text streamed as deltas, in word pieces
    live = embedded.live(job)
    deltas = [e.data["text"] for e in live if e.name is EventName.ASSISTANT_DELTA]
    assert "".join(deltas) == "Let me add. 2 + 3 = 5" and len(deltas) > 2
    # usage is counted
    usage = embedded.client.usage(job.conversation_id)
    assert usage.input_tokens > 0 and usage.output_tokens > 0


def test_a_parallel_batch_and_a_barrier_run_in_the_right_shape() -> None:
    # Given a model that calls p1, p2, a barrier b, then q1 and q2
    def model(request: ModelRequest) -> Reply | str:
        if request.steps:
            return "done"
        labels = [("h_note", "p1"), ("h_note", "p2"), ("h_note_alone", "b"), ("h_note", "q1")]
        return Reply.call(*(call(name, label=label) for name, label in [*labels, ("h_note", "q2")]))

    with Harness(modules=[HERE], model=FunctionModel(model)) as h:
        job = h.client.submit("h-ordering", "go")
        assert job.result() == "done"

        # Then each segment's parts ran before its advance, and the next
        # segment only after that advance (as a chord over a group does)
        calls = {c.id: c.result for c in tool_calls(h.client, job.id)}
        shape = [
            calls[a.call_id] if isinstance(a, ToolTask) else type(a).__name__
            for a in h.dispatcher.ran
        ]
        assert shape == [
            "RunStep",
            "p1",
            "p2",
            "RunAdvance",
            "b",
            "RunAdvance",
            "q1",
            "q2",
            "RunAdvance",
            "RunStep",
        ]
        assert [c.segment for c in tool_calls(h.client, job.id)] == [0, 0, 1, 2, 2]


def test_a_retry_waits_its_countdown_while_other_work_runs_first() -> None:
    # Given a model that fails once with a retryable error on "slow" jobs
    failures: list[float] = []

    def model(request: ModelRequest) -> Reply | str:
        if request.user_text == "slow" and not failures:
            failures.append(time.monotonic())
            raise ModelError("overloaded", status=529, retryable=True)
        return f"answered {request.user_text}"

    with Harness(modules=[HERE], model=FunctionModel(model)) as h:
        # When two jobs are sent together, the first failing once
        with h.held() as dispatcher:
            slow = h.client.submit("h-retrying", "slow")
            fast = h.client.submit("h-plain", "fast")
            assert [type(a) for a in dispatcher.pending] == [RunStep, RunStep]

        # Then the retry waited its countdown, and the other job ran meanwhile
        assert slow.result() == "answered slow" and fast.result() == "answered fast"
        steps = [a for a in h.dispatcher.ran if isinstance(a, RunStep)]
        assert [(s.conversation_id, s.countdown > 0) for s in steps] == [
            (slow.conversation_id, False),
            (fast.conversation_id, False),
            (slow.conversation_id, True),
        ]
        failed = h.events(slow, EventName.LLM_FAILED)
        assert len(failed) == 1 and failed[0].data["status"] == 529
        assert failed[0].data["retry_in"] == 0.3


def test_work_held_runs_one_item_at_a_time() -> None:
    with Harness(modules=[HERE], model=FunctionModel(calculator)) as h, h.held():
        job = h.client.submit("h-calculator", "2+3?")
        assert job.status().status is TurnStatus.RUNNING
        assert isinstance(h.run_next(), RunStep)
        assert isinstance(h.run_next(), ToolTask)
        assert isinstance(h.run_next(), RunAdvance)
        assert h.run() == 1  # the last step
        assert job.result() == "2 + 3 = 5"
        assert h.run_next() is None


def test_a_scripted_model_plays_its_script_per_agent() -> None:
    model = ScriptedModel(
        {
            "test/calculator": [Reply.call(call("h_add", a=1, b=1)), Reply.say("two")],
            "test/plain": [lambda messages: Reply.say(f"{len(messages)} messages")],
        }
    )
    with Harness(modules=[HERE], model=model) as h:
        assert h.client.submit("h-calculator", "1+1").result() == "two"
        assert h.client.submit("h-plain", "hi").result() == "1 messages"
        with pytest.raises(JobFailedError, match="no script for model 'test/ordering'"):
            h.client.submit("h-ordering", "go").result()


def test_errors_are_the_fleets_chorus_errors() -> None:
    def model(request: ModelRequest) -> Reply | str:
        if request.user_text == "crash":
            raise ValueError("the function broke")
        raise ModelError("bad request", status=400, body="{}", retryable=False)

    with Harness(modules=[HERE], model=FunctionModel(model)) as h:
        with pytest.raises(UnknownAgentError):
            h.client.submit("no-such-agent", "hi")
        with pytest.raises(InvalidRequestError, match="priority"):
            h.client.submit("h-plain", "hi", priority=10)
        with pytest.raises(ConversationNotFound):
            h.client.history("no-such-conversation")
        job = h.client.submit("h-plain", "hi")
        with pytest.raises(JobFailedError, match=r"bad request \(status 400\)") as failed:
            job.result()
        assert failed.value.status == "failed"
        crashed = h.client.submit("h-plain", "crash")
        with pytest.raises(JobFailedError, match="the model function raised ValueError"):
            crashed.result()


def test_a_harness_is_usable_only_while_open() -> None:
    with pytest.raises(ConfigurationError, match="no setting named 'max_dept'"):
        Harness(modules=[HERE], max_dept=2)
    h = Harness(modules=[HERE], model=FunctionModel(calculator), max_depth=2)
    with pytest.raises(ConfigurationError, match="not started"):
        h.client  # noqa: B018
    with h:
        assert h.runtime.settings.max_depth == 2
        assert h.client.submit("h-calculator", "2+3?").result() == "2 + 3 = 5"
    with pytest.raises(ConfigurationError, match="not started"):
        h.run()


def test_a_cancel_between_steps_drops_the_queued_tool_calls() -> None:
    with Harness(modules=[HERE], model=FunctionModel(calculator)) as h:
        # Given a job whose step asked for a tool call not yet run
        with h.held() as dispatcher:
            job = h.client.submit("h-calculator", "2+3?")
            assert isinstance(h.run_next(), RunStep)
            assert [type(a) for a in dispatcher.pending] == [ToolTask]

            # When the job is cancelled
            job.cancel()

            # Then the call is revoked: it never runs, and the turn ended cancelled
            assert [type(a) for a in dispatcher.pending] == [Dequeue]
        assert job.status().status is TurnStatus.CANCELLED
        with pytest.raises(JobFailedError, match="cancelled"):
            job.result()
        names = [e.name for e in h.events(job)]
        assert EventName.TOOL_STARTED not in names and names[-1] is EventName.TURN_CANCELLED
