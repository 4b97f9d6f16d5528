"""CHORUS_MAX_CHILDREN counts the children of one job (issue 8, item 9)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from orchestrator import Client, Settings
from tests.conftest import WorkerProcess

pytestmark = pytest.mark.integration

CAP = 3


@pytest.fixture(scope="module")
def capped(settings: Settings) -> Iterator[Client]:
    """A fleet of its own (own queues) whose workers allow 3 children per job."""
    own = settings.model_copy(
        update={"redis_prefix": f"{settings.redis_prefix}-cap", "max_children": CAP}
    )
    client = Client(own)
    worker = WorkerProcess(own, "capped", "-Q", "llm,control,tools", "-P", "threads", "-c", "8")
    try:
        worker.wait_ready(client)
        yield client
    finally:
        worker.stop()
        client.close()


def _children(answer: str) -> list[str]:
    return list(json.loads(answer.removeprefix("children: ")))


def test_every_job_of_a_conversation_may_start_up_to_the_cap(capped: Client) -> None:
    # Given a conversation whose first job used the whole fan-out allowance
    first = capped.submit("spawner", f"spawn {CAP}")
    assert _children(first.result(timeout=60)) == [f"done k{i}" for i in range(CAP)]

    # When later jobs on the same conversation spawn children again
    for _ in range(2):
        job = capped.submit("spawner", f"spawn {CAP}", conversation_id=first.conversation_id)
        # Then each may start its own CAP children
        assert _children(job.result(timeout=60)) == [f"done k{i}" for i in range(CAP)]

    # and one job asking for more than the cap gets the limit as an error result
    over = capped.submit("spawner", f"spawn {CAP + 1}", conversation_id=first.conversation_id)
    results = _children(over.result(timeout=60))
    refused = [r for r in results if r.startswith("Error: ")]
    assert len(results) == CAP + 1 and len(refused) == 1  # whichever claim came last
    assert refused[0] == f"Error: subagent limit reached ({CAP} children in this job)"
