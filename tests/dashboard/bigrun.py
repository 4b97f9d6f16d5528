"""A big finished run stored as the engine stores one: a root turn that fanned
out to 200 subagents, each a few steps of a model call and a tool, 10,000
events in all. Written straight to Postgres (running it on the 2-core test
fleet would take minutes); what the page under test reads is only these rows,
through the API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import insert

from orchestrator import Client
from orchestrator.store.tables import Conversation, EventRow, Turn, new_id, table

EVENTS = 10_000
CHILDREN = 200
CHILD_STEPS = 6


class _Log:
    def __init__(self, root: str, correlation: str) -> None:
        self.root, self.correlation = root, correlation
        self.rows: list[dict[str, Any]] = []
        self.at = datetime.now(UTC) - timedelta(hours=1)

    def add(self, name: str, conv: str, turn: str, step: int, **data: Any) -> None:
        self.at += timedelta(milliseconds=1)
        self.rows.append(
            {
                "root_id": self.root,
                "seq": len(self.rows) + 1,
                "name": name,
                "conversation_id": conv,
                "turn_id": turn,
                "step": step,
                "correlation_id": self.correlation,
                "data": data,
                "created_at": self.at,
            }
        )

    def step(self, conv: str, turn: str, step: int, tool: str | None) -> None:
        self.add("llm.requested", conv, turn, step, model="scripted/big")
        self.add("llm.completed", conv, turn, step, seconds=0.0005)
        self.add("usage", conv, turn, step, input_tokens=10, output_tokens=5, cost_usd=0.0001)
        self.add("assistant.message", conv, turn, step, text="", tool_calls=int(tool is not None))
        if tool is not None:
            rid = f"{conv[:6]}-{step}"
            common = {"tool": tool, "tool_request_id": rid}
            self.add("tool.requested", conv, turn, step, segment=0, params={}, **common)
            self.add("tool.started", conv, turn, step, attempt=1, **common)
            self.add("tool.completed", conv, turn, step, result="ok", **common)


def store_big_run(client: Client, tenant: str) -> str:
    """Store the run; its job id."""
    root, job, correlation = new_id(), new_id(), new_id()
    log = _Log(root, correlation)
    conversations = [_conversation(root, None, "big-lead", tenant, job)]
    turns = [_turn(job, root, root, "big-lead", correlation, None)]
    log.add("turn.started", root, job, 0, agent="big-lead", input="fan out")
    log.step(root, job, 0, None)
    children = []
    for i in range(CHILDREN):
        child, child_turn = new_id(), new_id()
        children.append((child, child_turn, f"call-{i}"))
        conversations.append(_conversation(child, root, "big-child", None, child_turn, depth=1))
        turns.append(_turn(child_turn, child, root, "big-child", correlation, job))
        log.add(
            "subagent.requested",
            root,
            job,
            0,
            tool="subagent__big-child",
            tool_request_id=f"call-{i}",
            segment=0,
            params={"task": f"t{i}"},
        )
    for child, child_turn, rid in children:
        log.add(
            "subagent.started",
            root,
            job,
            0,
            tool="subagent__big-child",
            tool_request_id=rid,
            child_conversation_id=child,
            child_turn_id=child_turn,
        )
        log.add("turn.started", child, child_turn, 0, agent="big-child", input="t")
        for step in range(CHILD_STEPS):
            log.step(child, child_turn, step, "timed" if step < CHILD_STEPS - 1 else None)
        log.add("turn.completed", child, child_turn, CHILD_STEPS)
        log.add(
            "subagent.completed",
            root,
            job,
            0,
            tool="subagent__big-child",
            tool_request_id=rid,
            result="done",
        )
    step = 1
    while len(log.rows) < EVENTS - 8:
        log.step(root, job, step, "timed")
        step += 1
    while len(log.rows) < EVENTS - 1:
        log.add("plan.updated", root, job, step, items=[])
    log.add("turn.completed", root, job, step, output="all done")
    with client.runtime.session() as session:
        session.execute(insert(table(Conversation)), conversations)
        session.execute(insert(table(Turn)), turns)
        session.execute(insert(table(EventRow)), log.rows)
        session.commit()
    return job


def _conversation(
    cid: str, parent: str | None, agent: str, tenant: str | None, turn: str, depth: int = 0
) -> dict[str, Any]:
    return {
        "id": cid,
        "root_id": cid if parent is None else parent,
        "parent_id": parent,
        "agent": agent,
        "agent_spec": {},
        "state": "idle",
        "turn_id": turn,
        "kind": "main" if parent is None else "subagent",
        "depth": depth,
        "tenant": tenant,
    }


def _turn(
    tid: str, cid: str, root: str, agent: str, correlation: str, job: str | None
) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "id": tid,
        "conversation_id": cid,
        "root_id": root,
        "number": 1,
        "agent": agent,
        "status": "completed",
        "input_text": "fan out",
        "context_data": {},
        "correlation_id": correlation,
        "job_id": job if job is not None else tid,
        "steps": CHILD_STEPS,
        "started_at": now - timedelta(hours=1),
        "finished_at": now - timedelta(minutes=59),
        "tree_children": CHILDREN if job is None else 0,
    }
