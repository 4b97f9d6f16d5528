"""The client under real use: resuming a finished job's events, a thousand
waiters on one Client, a turn longer than the old max_steps default."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest

from orchestrator import Client, Settings
from schemas import EventName, TurnStatus
from tests.agents import LONG_WALK

pytestmark = pytest.mark.integration


def test_events_since_the_last_seq_of_a_finished_turn_ends(client: Client, workers: Any) -> None:
    # Given a finished job and the sequence number of its last event
    job = client.submit("quick", "hello")
    job.result(timeout=60)
    seen = list(job.events(deltas=False, timeout=30))
    last = seen[-1].seq
    assert seen[-1].name is EventName.TURN_COMPLETED and last is not None

    # When a follower resumes from that last seq (or from one before it)
    started = time.monotonic()
    resumed = list(job.events(since=last, timeout=30))
    before_end = list(job.events(since=last - 1, timeout=30))

    # Then the first yields nothing and ends at once; the second yields the end
    assert resumed == []
    assert [e.name for e in before_end] == [EventName.TURN_COMPLETED]
    assert time.monotonic() - started < 10


def test_a_thousand_threads_wait_on_one_client(settings: Settings, workers: Any) -> None:
    # Given one client with ten Postgres connections at most (the suite's
    # parallel sessions share the server's max_connections), and 20 jobs
    # that each take a few seconds
    client = Client(settings.model_copy(update={"db_pool_size": 5, "db_pool_overflow": 5}))
    jobs = [client.submit("waited", f"job {i}") for i in range(20)]

    # When 1,000 threads wait on them through the one Client, half on
    # result() and half following events()
    results: list[str] = []
    errors: list[BaseException] = []
    waiting = Counter[str]()
    lock = threading.Lock()

    def wait(n: int) -> None:
        job = jobs[n % len(jobs)]
        try:
            if n % 2:
                with lock:
                    waiting["now"] += 1
                    waiting["peak"] = max(waiting["peak"], waiting["now"])
                answer = job.result(timeout=120)
            else:
                names = [e.name for e in job.events(deltas=False, timeout=120)]
                assert names[-1] is EventName.TURN_COMPLETED
                answer = job.status().output or ""
            with lock:
                results.append(answer)
        except BaseException as exc:  # reported below, with the thread's job
            with lock:
                errors.append(exc)
        finally:
            if n % 2:
                with lock:
                    waiting["now"] -= 1

    threads = [threading.Thread(target=wait, args=(n,), daemon=True) for n in range(1000)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)

    # Then every waiter gets its job's answer, and none fails for want of a
    # Redis connection
    assert not errors, errors[:3]
    assert len(results) == 1000
    assert Counter(results) == Counter({f"waited for job {i}": 50 for i in range(len(jobs))})
    assert all(j.status().status is TurnStatus.COMPLETED for j in jobs)
    assert waiting["peak"] > 100  # more waiters at once than redis-py's pool allows
    client.close()


def test_a_turn_of_thirty_steps_completes_with_the_default_max_steps(
    client: Client, workers: Any
) -> None:
    # Given an agent with the default max_steps whose turn takes 30 model calls
    job = client.submit("long-walker", "walk")

    # Then it completes
    assert job.result(timeout=180) == f"walked {LONG_WALK - 1} steps"
    assert job.status().step == LONG_WALK
