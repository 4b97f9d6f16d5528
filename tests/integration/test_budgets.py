"""Budgets per job under concurrency: children storing calls at once (the
budget decisions are tested on the harness: tests/engine/test_budgets.py)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import text
from sqlmodel import col, select

from orchestrator import Client, Settings
from orchestrator.store.tables import Turn
from schemas import Budget
from tests.agents import gate_path
from tests.conftest import tool_calls
from tests.integration.test_stops import _lock_waiters, _until

pytestmark = pytest.mark.integration


def test_children_storing_calls_at_once_stay_within_the_tool_call_budget(
    client: Client, workers: Any, settings: Settings
) -> None:
    # Given a job of 3 tool calls whose lead spent 2 on two children, each
    # about to call a tool once its model call is let go
    gate = uuid.uuid4().hex
    job = client.submit("adder-lead", gate, budget=Budget(tool_calls=3))
    for child in "ab":
        started = gate_path(settings.state_dir, f"{gate}-{child}-started")
        _until(started.exists, "a child's model call never started")
    with client.runtime.session() as barrier:
        # ... and the root's row held while both store their replies at once
        barrier.execute(
            text("SELECT id FROM chorus_conversation WHERE id = :id FOR UPDATE"),
            {"id": job.root_id},
        )
        for child in "ab":
            gate_path(settings.state_dir, f"{gate}-{child}").touch()
        _until(lambda: _lock_waiters(client) >= 2, "the children never both waited to store")
    job.result(timeout=60)

    # Then the tree ran 3 tool calls, not 4: one child's call ran, the other's was refused
    with client.runtime.session() as s:
        children = s.exec(
            select(Turn.id).where(Turn.job_id == job.id, col(Turn.parent_call_id).is_not(None))
        ).all()
        spent = s.exec(select(Turn.tree_tool_calls).where(Turn.id == job.id)).one()
    calls = [c for turn in children for c in tool_calls(client, turn)]
    assert sorted(c.status for c in calls) == ["completed", "failed"]
    assert "tool-call budget of this job is spent" in next(c.result for c in calls if c.is_error)
    assert spent == 3
