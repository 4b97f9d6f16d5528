"""Structured output: a final_answer tool, validated, with bounded retries."""

from __future__ import annotations

import json

import pytest

from orchestrator import Client, JobFailedError
from schemas import EventName, TurnStatus


def test_structured_output_round_trip_with_an_invalid_attempt(client: Client) -> None:
    # Given a model that first answers in text, then gives an invalid final
    # answer, then (having seen the validation errors) a valid one
    job = client.submit("extractor", "Plan: Lisbon for three nights")
    output = job.result(timeout=60)

    # Then the job carries the validated object
    status = job.status()
    assert status.status is TurnStatus.COMPLETED
    assert status.structured == {"city": "Lisbon", "nights": 3}
    assert json.loads(output) == status.structured
    failed = [e for e in job.events(deltas=False, timeout=5) if e.name is EventName.TOOL_FAILED]
    assert len(failed) == 1 and "nights" in failed[0].data["result"]
    assert status.step == 3


def test_invalid_output_is_retried_a_bounded_number_of_times(client: Client) -> None:
    job = client.submit("stubborn", "Plan a trip")
    with pytest.raises(JobFailedError, match="no valid structured output after 3 attempts"):
        job.result(timeout=60)
    assert job.status().step == 3
