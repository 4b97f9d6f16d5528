"""Answers to calls that never waited: refused, and nothing runs again."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator import Client, ConflictError
from schemas import TurnStatus
from tests.conftest import tool_calls
from tests.integration.test_approvals import _waiting

pytestmark = pytest.mark.integration


def test_approving_a_call_that_never_waited_runs_nothing_again(
    client: Client, workers: Any, tmp_path: Path
) -> None:
    mark = tmp_path / "mark"
    job = client.submit("travel-desk", "book", context_data={"mark": str(mark)})
    _waiting(client, job)
    deadline = time.monotonic() + 30
    while not (done := [c for c in tool_calls(client, job.id) if c.tool == "lookup_city"]) or (
        done[0].status != "completed"
    ):
        assert time.monotonic() < deadline, "lookup_city did not complete"
        time.sleep(0.05)
    # the ungated call that already ran, approved or denied: both refused
    with pytest.raises(ConflictError):
        client.approve(done[0].id)
    with pytest.raises(ConflictError):
        client.deny(done[0].id, reason="too late")
    [gated] = [c for c in tool_calls(client, job.id) if c.tool == "book_flight"]
    client.approve(gated.id)
    assert job.result(timeout=30)
    with pytest.raises(ConflictError):  # answered once: the first answer stands
        client.deny(gated.id, reason="changed my mind")
    assert job.status().status is TurnStatus.COMPLETED
    assert sorted(mark.read_text().splitlines()) == ["book_flight LIS-123", "lookup_city Lisbon"]
