"""Human approvals, decided in process: a gated call waits, an answer moves it on."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import select

from orchestrator import (
    Agent,
    ApprovalNotFound,
    Client,
    ConflictError,
    InvalidRequestError,
    Job,
)
from orchestrator.engine import approvals
from orchestrator.engine.sweep import sweep
from orchestrator.store.tables import Conversation
from orchestrator.testing import Harness
from schemas import Decision, EventName, PendingApproval, TurnStatus
from tests.approval_agents import stored_events
from tests.conftest import tool_calls
from tests.engine.conftest import services_harness
from tests.services import Services


def _waiting(client: Client, job: Job) -> PendingApproval:
    [found] = client.pending_approvals(conversation_id=job.conversation_id)
    return found


def _runs(mark: Path) -> list[str]:
    return mark.read_text().splitlines() if mark.exists() else []


def test_a_gated_call_waits_while_the_rest_of_its_segment_runs_then_runs_once_approved(
    client: Client, tmp_path: Path
) -> None:
    # Given a model that calls lookup_city and book_flight (approval=True) in one segment
    mark = tmp_path / "mark"
    job = client.submit("travel-desk", "book Lisbon", context_data={"mark": str(mark)})

    # Then lookup_city ran, book_flight waits with its arguments, and the turn waits
    assert _runs(mark) == ["lookup_city Lisbon"]
    waiting = _waiting(client, job)
    assert (waiting.tool, waiting.arguments, waiting.agent) == (
        "book_flight",
        {"flight": "LIS-123"},
        "travel-desk",
    )
    assert (waiting.job_id, waiting.root_id, waiting.deadline) == (job.id, job.root_id, None)
    assert job.status().status is TurnStatus.RUNNING
    [requested] = stored_events(client, job, EventName.TOOL_APPROVAL_REQUESTED)
    assert requested.data["params"] == {"flight": "LIS-123"}
    assert requested.data["call_id"] == waiting.call_id

    # When a person approves it
    client.approve(waiting.call_id, note="fine", by="alice")

    # Then it ran once and the model saw both results
    assert "booked LIS-123" in job.result(timeout=30)
    assert _runs(mark) == ["lookup_city Lisbon", "book_flight LIS-123"]
    [approved] = [e for e in job.events(deltas=False) if e.name is EventName.TOOL_APPROVED]
    assert (approved.data["by"], approved.data["note"]) == ("alice", "fine")
    assert client.pending_approvals(conversation_id=job.conversation_id) == []

    # And a second answer is a conflict, never a second run
    with pytest.raises(ConflictError, match="already approved by 'alice'"):
        client.approve(waiting.call_id)
    with pytest.raises(ConflictError):
        client.deny(waiting.call_id, reason="too late")
    assert _runs(mark) == ["lookup_city Lisbon", "book_flight LIS-123"]


def test_a_denied_call_never_runs_and_the_model_sees_the_reason(
    client: Client, tmp_path: Path
) -> None:
    mark = tmp_path / "mark"
    job = client.submit("travel-desk", "book Lisbon", context_data={"mark": str(mark)})
    waiting = _waiting(client, job)

    client.deny(waiting.call_id, reason="over budget", by="bob")

    answer = job.result(timeout=30)
    assert "Error: tool 'book_flight' was not run: denied: over budget" in answer
    assert _runs(mark) == ["lookup_city Lisbon"]
    names = [e.name for e in job.events(deltas=False)]
    assert EventName.TOOL_DENIED in names and EventName.TOOL_FAILED in names
    [denied] = [e for e in job.events(deltas=False) if e.name is EventName.TOOL_DENIED]
    assert (denied.data["by"], denied.data["reason"]) == ("bob", "over budget")
    [call] = [c for c in tool_calls(client, job.id) if c.tool == "book_flight"]
    assert (call.status, call.answer, call.answered_by) == ("failed", "denied", "bob")


def test_an_agent_gates_a_tool_with_approve_and_filters_find_it(
    client: Client, tmp_path: Path
) -> None:
    job = client.submit("refund-desk", "refund 40", context_data={"mark": str(tmp_path / "m")})

    waiting = client.pending_approvals(agent="refund-desk", tool="issue_refund")
    mine = [w for w in waiting if w.job_id == job.id]
    assert [w.arguments for w in mine] == [{"amount": 40}]
    assert mine[0].deadline is not None  # the agent's approval_timeout
    assert client.pending_approvals(agent="refund-desk", tool="book_flight") == []
    client.approve(mine[0].call_id)
    assert "refunded 40" in job.result(timeout=30)


def test_bad_answers_are_typed_errors(client: Client) -> None:
    with pytest.raises(ApprovalNotFound):
        client.approve("no-such-call")
    job = client.submit("travel-desk", "book")
    waiting = _waiting(client, job)
    with pytest.raises(InvalidRequestError, match="reason"):
        client.deny(waiting.call_id, reason="  ")
    with pytest.raises(InvalidRequestError, match="by"):
        client.approve(waiting.call_id, by="x" * 201)
    with pytest.raises(InvalidRequestError, match="call_id"):
        client.approve("")
    client.cancel(job.id)


def test_approve_must_name_tools_of_the_agent() -> None:
    with pytest.raises(InvalidRequestError, match=r"not tools of agent 'gatekeeper'"):
        Agent("gatekeeper", "scripted/travel-desk", tools=["lookup_city"], approve=["issue_refund"])


@pytest.fixture(scope="module")
def swept(services: Services) -> Iterator[Harness]:
    """A harness whose sweeper sees a turn as stalled after half a second."""
    with services_harness(services, stall_timeout=0.5) as h:
        yield h


def _sweep(h: Harness) -> None:
    h.dispatcher.send(sweep(h.runtime))


def test_a_waiting_call_is_not_a_stall(swept: Harness, tmp_path: Path) -> None:
    job = swept.client.submit("travel-desk", "book", context_data={"mark": str(tmp_path / "m")})
    for _ in range(3):
        time.sleep(0.6)
        _sweep(swept)
    with swept.runtime.session() as s:
        conv = s.exec(select(Conversation).where(Conversation.id == job.conversation_id)).one()
    assert (conv.redispatches, job.status().status) == (0, TurnStatus.RUNNING)
    assert len(swept.client.pending_approvals(conversation_id=job.conversation_id)) == 1
    swept.client.cancel(job.id)


def test_an_answer_whose_dispatch_was_lost_is_run_by_the_sweeper(
    swept: Harness, tmp_path: Path
) -> None:
    # Given an approval stored, whose tool task was never sent (the process died)
    mark = tmp_path / "mark"
    job = swept.client.submit("travel-desk", "book", context_data={"mark": str(mark)})
    waiting = _waiting(swept.client, job)
    lost = approvals.answer(swept.runtime, waiting.call_id, Decision.APPROVED, "carol", None)
    assert lost  # what would have been sent
    assert job.status().status is TurnStatus.RUNNING

    # When the sweeper finds the segment stalled
    time.sleep(0.6)
    _sweep(swept)

    # Then the approved call ran, once, and the turn ended
    assert "booked LIS-123" in job.result(timeout=30)
    assert _runs(mark).count("book_flight LIS-123") == 1


def test_a_wait_past_its_timeout_is_denied_by_the_sweeper(swept: Harness, tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    job = swept.client.submit("refund-desk", "refund", context_data={"mark": str(mark)})
    _waiting(swept.client, job)
    _sweep(swept)
    assert job.status().status is TurnStatus.RUNNING  # not yet due

    time.sleep(2.1)  # the agent's approval_timeout
    _sweep(swept)

    assert "Error: tool 'issue_refund' was not run: denied: no answer in 2 s" in job.result(
        timeout=30
    )
    [denied] = [e for e in job.events(deltas=False) if e.name is EventName.TOOL_DENIED]
    assert denied.data["by"] == approvals.TIMEOUT_ANSWERER
    assert not mark.exists()
