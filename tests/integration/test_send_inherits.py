"""A sent message's turn inherits the last job's context_data, budget and
priority unless the send gives its own (issue 21, item 8)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlmodel import select

from orchestrator import Client, InvalidRequestError, Job
from orchestrator.store.tables import Conversation, EventRow, Turn
from schemas import Budget, EventName

pytestmark = pytest.mark.integration


def _job_for(client: Client, conversation_id: str, entry: str, timeout: float = 60) -> Job:
    deadline = time.monotonic() + timeout
    while (job := client.job_for_message(conversation_id, entry)) is None:
        assert time.monotonic() < deadline, f"message {entry} never started a turn"
        time.sleep(0.1)
    return job


def _ran_with(client: Client, job: Job) -> tuple[dict[str, Any], dict[str, Any] | None, int]:
    """The context_data and budget stored on the job's turn, and the priority
    its conversation's tasks were sent with."""
    with client.runtime.session() as s:
        turn = s.get(Turn, job.id)
        conv = s.get(Conversation, job.conversation_id)
        assert turn is not None and conv is not None
        return turn.context_data, turn.budget, conv.priority


def test_a_sent_message_inherits_the_last_jobs_context_budget_and_priority(
    client: Client, workers: Any
) -> None:
    # Given a tenant's job with its context, budget and priority
    budget = Budget(steps=7, cost_usd=1.5)
    first = client.submit(
        "tenant-echo", "first", context_data={"tenant": "acme"}, budget=budget, priority=8
    )
    assert first.result(timeout=60) == '{"tenant": "acme"}'

    # When a follow-up is sent without options
    follow_up = _job_for(client, first.conversation_id, client.send(first.conversation_id, "next"))

    # Then its tool sees the tenant, and its turn runs with the same budget and priority
    assert follow_up.result(timeout=60) == '{"tenant": "acme"}'
    assert _ran_with(client, follow_up) == (
        {"tenant": "acme"},
        budget.model_dump(mode="json"),
        8,
    )

    # When a send gives its own, those win, and are recorded with the message
    other = Budget(steps=5)
    entry = client.send(
        first.conversation_id, "again", context_data={"tenant": "globex"}, budget=other, priority=2
    )
    overridden = _job_for(client, first.conversation_id, entry)
    assert overridden.result(timeout=60) == '{"tenant": "globex"}'
    assert _ran_with(client, overridden) == (
        {"tenant": "globex"},
        other.model_dump(mode="json"),
        2,
    )
    with client.runtime.session() as s:
        queued = s.exec(
            select(EventRow)
            .where(
                EventRow.root_id == first.root_id,
                EventRow.name == EventName.MESSAGE_QUEUED.value,
            )
            .order_by(EventRow.seq)
        ).all()
    assert [{k: v for k, v in e.data.items() if k != "entry"} for e in queued] == [
        {"text": "next"},
        {
            "text": "again",
            "context_data": {"tenant": "globex"},
            "budget": {"steps": 5},
            "priority": 2,
        },
    ]

    # And the next plain send inherits from that last job
    latest = _job_for(client, first.conversation_id, client.send(first.conversation_id, "last"))
    assert latest.result(timeout=60) == '{"tenant": "globex"}'
    assert _ran_with(client, latest) == ({"tenant": "globex"}, other.model_dump(mode="json"), 2)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"priority": 10}, "priority"),
        ({"priority": "9"}, "priority"),
        ({"context_data": {"x": float("nan")}}, "context_data"),
        ({"context_data": {"x": "y" * 300_000}}, "context_data"),
        ({"context_data": ["not", "an", "object"]}, "context_data"),
    ],
)
def test_a_send_with_bad_options_is_refused_naming_the_field(
    client: Client, options: dict[str, Any], field: str
) -> None:
    job = client.submit("quick", "hello")
    job.result(timeout=60)
    with pytest.raises(InvalidRequestError) as refused:
        client.send(job.conversation_id, "more", **options)
    assert any(f.startswith(field) for f in refused.value.fields), refused.value.fields
    assert client.clear_queue(job.conversation_id) == 0
