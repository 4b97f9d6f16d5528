"""Replay of tool-calling cases through real workers: two catalogs declared
from JSON schemas (tests/catalogs), dotted and over-long names, two
``list_all_airports`` in two namespaces, parallel calls, multi-turn
conversations and a 30-step turn (cases in tests/agents.py).

Checked: the model is offered every schema exactly as declared under
provider-legal, distinct aliases; every call runs exactly once with exactly
the arguments sent; rows, history and events carry the qualified name;
parallel calls share one segment; a schema violation is an error result
naming the JSON path and never runs.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import col, select

from orchestrator import Client, ConfigurationError, Settings, schema_tool
from orchestrator.store.tables import ToolCallRow
from orchestrator.tools.names import ALIAS_PATTERN
from schemas import ToolCallBlock
from tests.agents import CATALOG_CALLS_FILE, CATALOG_CASE_DATA, CATALOG_CASES, CATALOG_DEFINITIONS

pytestmark = pytest.mark.usefixtures("workers")


def _agent(case: str) -> str:
    return f"catalog-{case}".replace(".", "-")[:60]


def _run(client: Client, case: str) -> tuple[str, list[str], list[str]]:
    """Run every turn of ``case``: (conversation id, turn ids, outputs)."""
    conversation, turns, outputs = None, [], []
    for i, _ in enumerate(CATALOG_CASES[case]):
        job = client.submit(_agent(case), f"{case} turn {i}", conversation_id=conversation)
        outputs.append(job.result(timeout=120))
        conversation = job.conversation_id
        turns.append(job.id)
    assert conversation is not None
    return conversation, turns, outputs


@pytest.fixture(scope="module")
def replayed(client: Client) -> dict[str, tuple[str, list[str], list[str]]]:
    # the longest cases first, so the others run beside them
    cases = sorted(CATALOG_CASES, key=lambda c: -sum(map(len, CATALOG_CASES[c])))
    with ThreadPoolExecutor(8) as pool:
        return dict(zip(cases, pool.map(lambda c: _run(client, c), cases), strict=True))


def _records(settings: Settings) -> list[dict[str, Any]]:
    path = Path(settings.state_dir) / CATALOG_CALLS_FILE
    return [json.loads(line) for line in path.read_text().splitlines()]


def _rows(client: Client, turn_ids: list[str]) -> list[ToolCallRow]:
    with client.runtime.session() as s:
        rows = list(s.exec(select(ToolCallRow).where(col(ToolCallRow.turn_id).in_(turn_ids))))
        s.expunge_all()
    return sorted(rows, key=lambda r: (turn_ids.index(r.turn_id), r.step, r.position))


def _key(tool: str, arguments: dict[str, Any]) -> tuple[str, str]:
    return tool, json.dumps(arguments, sort_keys=True)


def test_the_model_is_offered_each_schema_exactly_as_declared(replayed: dict[str, Any]) -> None:
    declared = list(CATALOG_DEFINITIONS.values())
    for case, (_, _, outputs) in replayed.items():
        for output in outputs:
            # the catalog's tools (no read_tool_output: no output was cut)
            offered = json.loads(output)
            assert [t["type"] for t in offered] == ["function"] * len(declared), case
            functions = [t["function"] for t in offered]
            assert [
                {"description": f["description"], "parameters": f["parameters"]} for f in functions
            ] == [
                {"description": d["description"], "parameters": d["parameters"]} for d in declared
            ], case
            names = [f["name"] for f in functions]
            assert all(ALIAS_PATTERN.match(n) for n in names), names
            assert len(set(names)) == len(names)
            assert "travel__list_all_airports" in names
            assert "atlas__v2__list_all_airports" in names
            assert "atlas__v2__geo__distance_between" in names
            long = [n for n in names if n.startswith("atlas__v2__compute_the_great_circle")]
            assert len(long) == 1 and len(long[0]) == 64 and re.search(r"_[0-9a-f]{8}$", long[0])


def test_every_call_runs_once_with_the_arguments_sent(
    client: Client, settings: Settings, replayed: dict[str, Any]
) -> None:
    records = _records(settings)
    invalid = {_key(v["tool"], v["arguments"]) for v in CATALOG_CASE_DATA["violations"]}
    for case, (conversation, turn_ids, _) in replayed.items():
        sent = [
            _key(tool, arguments)
            for steps in CATALOG_CASES[case]
            for calls in steps
            for tool, arguments in calls
        ]
        ran = [r for r in records if r["conversation_id"] == conversation]
        expected = [k for k in sent if k not in invalid]
        assert Counter(_key(r["tool"], r["arguments"]) for r in ran) == Counter(expected), case
        assert len({r["tool_request_id"] for r in ran}) == len(ran)  # once each
        rows = _rows(client, turn_ids)
        assert [_key(r.tool, r.params) for r in rows] == sent, case  # qualified names
        history = client.history(conversation)
        called = [b.tool for m in history for b in m.content if isinstance(b, ToolCallBlock)]
        assert called == [tool for tool, _ in sent]


def test_parallel_calls_share_a_segment_and_long_turns_finish(
    client: Client, replayed: dict[str, Any]
) -> None:
    parallel = [c for c in CATALOG_CASES if c.startswith("parallel-")]
    assert parallel
    for case in parallel:
        rows = _rows(client, replayed[case][1])
        assert len(rows) > 1 and {r.segment for r in rows} == {0}, case
    rows = _rows(client, replayed["sequential-30"][1])
    assert len(rows) == 30 and len({r.step for r in rows}) == 30
    assert all(r.is_error is False for r in rows)


def test_a_schema_violation_is_an_error_result_naming_the_path(
    client: Client, replayed: dict[str, Any]
) -> None:
    for i, violation in enumerate(CATALOG_CASE_DATA["violations"]):
        conversation = replayed[f"violation-{i}"][0]
        history = client.history(conversation)
        results = [b for m in history for b in m.content if getattr(b, "type", "") == "tool_result"]
        assert len(results) == 1
        result = results[0]
        assert result.is_error and result.tool == violation["tool"]
        assert f"invalid arguments for tool {violation['tool']!r}" in result.result
        assert f"{violation['path']}:" in result.result, result.result
    events = list(client.job(replayed["violation-0"][1][0]).events(deltas=False))
    failed = [e for e in events if e.name == "tool.failed"]
    assert [e.data["tool"] for e in failed] == ["travel.search_direct_flight"]
    assert "$.date: 'next friday' is not a 'date'" in failed[0].data["result"]


def test_a_bad_schema_or_a_clash_is_refused_at_declaration() -> None:
    with pytest.raises(ConfigurationError, match=r"'bad\.minimum'.*\$\.properties\.n"):
        schema_tool(
            "minimum",
            "",
            {"type": "object", "properties": {"n": {"type": "integer", "minimum": "one"}}},
            lambda n: n,
            namespace="bad",
        )
