"""Hostile broker state beyond undecodable queue messages (issue 21, item 14):
malformed entries in the unacknowledged hash, and keys of the wrong type
where a queue or the hash should be. A worker and the sweeper must go on."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from orchestrator import Client
from orchestrator.celery_conf import QUEUES
from orchestrator.engine.broker import BrokerView
from orchestrator.engine.sweep import sweep
from orchestrator.keys import dropped_messages
from orchestrator.metrics import ChorusCollector
from tests.conftest import WorkerProcess
from tests.faults import isolated_settings, push_onto_queues
from tests.fleet import running_beat
from tests.integration.test_broker_faults import _envelope
from tests.services import Services

pytestmark = pytest.mark.integration

#: Values a corrupted write (or anyone with access to Redis) may leave in
#: the unacknowledged hash: none is kombu's ``[message, exchange, key]``.
MALFORMED_UNACKED = [
    b'{"0": 1}',
    b"{}",
    b"\x00\xff not JSON",
    b"[]",
    b"[null]",
    b'["not a message"]',
    b'[{"headers": []}]',
    b"7",
]


def test_the_sweepers_view_of_the_broker_skips_malformed_unacked_entries(
    services: Services, tmp_path: Path
) -> None:
    with isolated_settings(services, tmp_path) as settings:
        client = Client(settings)
        try:
            broker = redis.Redis.from_url(settings.redis_url or "")
            unacked = f"{settings.redis_prefix}:unacked"
            for i, raw in enumerate(MALFORMED_UNACKED):
                broker.hset(unacked, f"bad-{i}", raw)
                broker.zadd(f"{unacked}_index", {f"bad-{i}": time.time() - 3600})
            # The view reads past them
            view = BrokerView.read(client.runtime, sorted(set(QUEUES.values())))
            assert view.delivered == []
            # and a sweep runs, taking out those past the stall timeout
            # (kombu's restore of unacked messages fails on each)
            sweep(client.runtime)
            assert broker.hlen(unacked) == 0
            assert broker.zcard(f"{unacked}_index") == 0
        finally:
            client.close()


def _task(task: str, body: str = "W1tdLCB7fSwge31d", **headers: object) -> bytes:
    """A Celery protocol 2 message of ``task`` with its id and ``headers``."""
    return _envelope({"task": task, "id": f"crafted-{task}", **headers}, body=body)


#: Envelopes that look like Chorus's tasks, each wrong in one field.
ODD_TASKS = [
    _task("chorus.step", body="!!! not base64"),
    _task("chorus.step", body="e30="),  # {}: not [args, kwargs, embed]
    _task("chorus.advance", eta="not a date"),
    _task("chorus.tool", expires="not a date"),
    _task("chorus.tool", timelimit=["a", "b"]),
    _task("chorus.dequeue", retries="many"),
    _task("chorus.sweep", argsrepr=None, kwargsrepr=[1]),
    _task("chorus.step", priority="high"),
]


def _restore_failures(worker: WorkerProcess, since: int) -> int:
    """How often the worker's periodic restore of unacked messages (kombu,
    every 10 s) failed on an entry since ``since`` (:meth:`WorkerProcess.log_end`)."""
    with worker.log_path.open("rb") as log:
        log.seek(since)
        lines = log.read().decode(errors="replace").splitlines()
    return sum(1 for line in lines if "Error in timer" in line and "restore_visible" in line)


@pytest.mark.long
@pytest.mark.timeout(180)
def test_a_worker_goes_on_past_malformed_unacked_entries_and_keys_of_the_wrong_type(
    services: Services, tmp_path: Path
) -> None:
    # Given a worker of its own (restoring unacked messages every 10 s), and
    # (once the fleet has a step to re-send) a sweeper quick to re-send it
    with isolated_settings(
        services, tmp_path, visibility_timeout=60, stall_timeout=3.0, sweep_interval=1.0
    ) as settings:
        client = Client(settings)
        worker = WorkerProcess(settings, "all", "-Q", "llm,control,tools", "-P", "threads")
        try:
            worker.wait_ready(client, 120)
            broker = redis.Redis.from_url(settings.redis_url or "")
            prefix = settings.redis_prefix
            # When the unacked hash holds malformed entries past their
            # visibility timeout, and a priority list of a queue is a hash
            since = worker.log_end()
            unacked = f"{prefix}:unacked"
            for i, raw in enumerate(MALFORMED_UNACKED):
                broker.hset(unacked, f"bad-{i}", raw)
                broker.zadd(f"{unacked}_index", {f"bad-{i}": time.time() - 3600})
            broker.hset(f"{prefix}:tools\x06\x163", "not", "a list")
            broker.set(dropped_messages(prefix), "not a counter")
            # and two restore cycles met the malformed entries
            deadline = time.monotonic() + 60
            while _restore_failures(worker, since) < 2:
                assert worker.proc.poll() is None, "the worker stopped"
                assert time.monotonic() < deadline, "no two restore cycles in 60 s"
                time.sleep(0.5)
            # and messages of Chorus's tasks, each wrong in one field, reach its
            # queues (pushed after those cycles: one is a sweep, which would
            # take the malformed entries out) and it takes them all
            push_onto_queues(settings, ODD_TASKS)
            queues = [f"{prefix}:{q}" for q in ("control", "llm", "tools")]
            deadline = time.monotonic() + 30
            while any(broker.llen(q) for q in queues):
                assert time.monotonic() < deadline, "the crafted messages were not all taken"
                time.sleep(0.2)
            # Then it still runs jobs
            assert client.submit("fleet-batch", "2 0.1").result(timeout=60) == "slept 2"
            assert worker.proc.poll() is None
            # and the metrics exporter still reports (without the counter)
            families = {f.name for f in ChorusCollector(client.runtime).collect()}
            assert "chorus_broker_messages_dropped" not in families
            broker.delete(dropped_messages(prefix))
            # and when the unacked hash and its index are strings
            broker.delete(unacked, f"{unacked}_index")
            broker.set(unacked, "not a hash")
            broker.set(f"{unacked}_index", "not a sorted set")
            # Then it moves them aside too and runs jobs (the message whose
            # delivery met them is lost: the sweeper re-sends its step)
            with running_beat(settings):
                job = client.submit("fleet-batch", "2 0.1")
                assert job.result(timeout=90) == "slept 2"
            assert worker.proc.poll() is None
            aside = sorted(k.decode() for k in broker.scan_iter(f"{prefix}:*:wrongtype:*"))
            assert len(aside) == 3, aside
        finally:
            worker.stop()
            client.close()
    log = worker.log_path.read_text(errors="replace")
    assert "Unrecoverable error" not in log
