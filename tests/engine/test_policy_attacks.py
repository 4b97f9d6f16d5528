"""Hostile policies on the harness (issue 22's attack): what a policy may
not do fails the turn with a PolicyError, the conversation stays usable,
and no credential reaches an event or a row."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from orchestrator import Agent, JobFailedError
from orchestrator.policies import Defer, ModelCall, Policy, register_policy
from orchestrator.testing import FunctionModel, Harness, ModelRequest

SECRET = "sk-proj-NOTREALBUTSHAPEDLIKEAKEY1234"


class Rewrites(Policy):
    """Rewrites every model call as ``rewrite`` says."""

    rewrite: Callable[[ModelCall], Any] = staticmethod(lambda c: c)

    def before_model(self, call: ModelCall) -> Any:
        return type(self).rewrite(call)


register_policy("attack-rewrites", Rewrites())
Agent("attack-rewritten", "openai/primary", policies=["attack-rewrites"])


def _answer(request: ModelRequest) -> str:
    return "done"


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    with Harness(model=FunctionModel(_answer)) as h:
        yield h


def _rows_holding(h: Harness, text: str) -> list[str]:
    database = h.runtime.settings.db_url.split("///", 1)[1]
    found = []
    with sqlite3.connect(database) as db:
        tables = [t for (t,) in db.execute("select name from sqlite_master where type='table'")]
        for table in tables:
            found += [table for row in db.execute(f"select * from {table}") if text in repr(row)]
    return found


@pytest.mark.parametrize(
    "model",
    [
        f"openai/gpt-4o?api_key={SECRET}",  # a query, no scheme
        f"openai/{SECRET}",  # a key-shaped name
    ],
)
def test_a_policy_cannot_put_a_credential_in_the_model_string(
    harness: Harness, model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Rewrites, "rewrite", staticmethod(lambda c: c.rewrite(model=model)))
    job = harness.client.submit("attack-rewritten", "hello")
    with pytest.raises(JobFailedError, match="credentials"):
        job.result(timeout=30)
    events = json.dumps([e.data for e in harness.events(job)], default=str)
    assert SECRET not in events
    assert _rows_holding(harness, SECRET) == []

    monkeypatch.setattr(Rewrites, "rewrite", staticmethod(lambda c: c))
    again = harness.client.submit("attack-rewritten", "again", conversation_id=job.conversation_id)
    assert again.result(timeout=30) == "done"


@pytest.mark.parametrize("seconds", [86_401, 1e12, float("nan"), -1, True])
def test_a_deferral_past_a_day_or_not_a_number_fails_the_turn(
    harness: Harness, seconds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Rewrites, "rewrite", staticmethod(lambda c: Defer(seconds)))
    job = harness.client.submit("attack-rewritten", "hello")
    with pytest.raises(JobFailedError, match="a deferral is 0 to 86,400 seconds"):
        job.result(timeout=30)

    monkeypatch.setattr(Rewrites, "rewrite", staticmethod(lambda c: c))
    again = harness.client.submit("attack-rewritten", "again", conversation_id=job.conversation_id)
    assert again.result(timeout=30) == "done"
