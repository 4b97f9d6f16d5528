"""The broker misbehaving must cost a delay, never the fleet.

(a) Redis (AOF, as compose runs it) killed -9 and restarted while a model
    call and a tool run: plain `chorus worker` processes (no supervisor)
    stay up, reconnect, and finish both calls once; the same when their
    connections are cut while Redis stays up;
(b) bytes that are not a message pushed onto a queue's list: the worker
    logs, counts and drops each, and goes on.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis
from celery.worker import state
from kombu import Producer, Queue
from sqlmodel import select

from orchestrator import Client, Job, Settings
from orchestrator.celery_conf import make_celery
from orchestrator.keys import dropped_messages
from orchestrator.metrics import ChorusCollector
from orchestrator.store.tables import ToolCallRow
from schemas import AgentSpec
from tests.conftest import WorkerProcess
from tests.faults import PrivateRedis, isolated_settings, push_onto_queues
from tests.loopback_llm import LoopbackLLM
from tests.services import Services

pytestmark = pytest.mark.integration

#: How long the model call and the tool in flight take: Redis is down for
#: two seconds in the middle.
CALL_SECONDS = 10.0


def _alive(*workers: WorkerProcess) -> None:
    for w in workers:
        assert w.proc.poll() is None, (
            f"worker {w.name} exited ({w.proc.returncode}):\n"
            + w.log_path.read_text(errors="replace")[-3000:]
        )


def _wait(what: str, done: object, timeout: float, *workers: WorkerProcess) -> None:
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        _alive(*workers)
        assert time.monotonic() < deadline, f"{what}: not after {timeout:.0f}s"
        time.sleep(0.2)


def _answers_ping(client: Client, worker: WorkerProcess) -> None:
    """The worker answers a ping (the client's pooled broker connection
    died with Redis: the first command on it fails, and it reconnects)."""
    try:
        worker.wait_ready(client, 30)
    except redis.ConnectionError:
        worker.wait_ready(client, 30)


def _wait_running_tool(client: Client, conversation_id: str, worker: WorkerProcess) -> None:
    _wait(
        "the tool started",
        lambda: any(c.status == "running" for c in _tool_calls(client, conversation_id)),
        60,
        worker,
    )


def _calls_in_flight(
    client: Client, llm: LoopbackLLM, llm_worker: WorkerProcess, tools_worker: WorkerProcess
) -> tuple[Job, Job]:
    """A job whose model call is in flight (the provider answers after
    CALL_SECONDS) and one whose tool is running (it sleeps as long)."""
    llm.enqueue_text("Slow but sure.", delay=CALL_SECONDS)
    spec = AgentSpec(
        name="slow-thinker",
        model="openai/loopback-model",
        model_settings={"api_base": llm.base_url},
    )
    thinking = client.submit(spec, "Take your time.")
    sleeping = client.submit("fleet-batch", f"1 {CALL_SECONDS}")
    _wait("the model call started", lambda: llm.received, 60, llm_worker)
    _wait_running_tool(client, sleeping.conversation_id, tools_worker)
    return thinking, sleeping


def _calls_survived(
    client: Client,
    llm: LoopbackLLM,
    jobs: tuple[Job, Job],
    workers: tuple[WorkerProcess, WorkerProcess],
    timeout: float,
) -> None:
    """The jobs of :func:`_calls_in_flight` completed, the provider was asked
    once (the running call was kept, not lost and paid again), the tool ran
    once, and every worker is still the process it was and answers again."""
    thinking, sleeping = jobs
    assert thinking.result(timeout=timeout) == "Slow but sure."
    assert sleeping.result(timeout=timeout) == "slept 1"
    assert len(llm.received) == 1
    assert [c.attempts for c in _tool_calls(client, sleeping.conversation_id)] == [1]
    _alive(*workers)
    for worker in workers:
        _answers_ping(client, worker)


def _tool_calls(client: Client, conversation_id: str) -> list[ToolCallRow]:
    with client.runtime.session() as s:
        return list(
            s.exec(select(ToolCallRow).where(ToolCallRow.conversation_id == conversation_id))
        )


@pytest.mark.long
@pytest.mark.timeout(240)
def test_workers_survive_a_redis_restart_and_finish_their_running_calls(
    services: Services, tmp_path: Path
) -> None:
    # Given plain workers (threads for model calls, prefork for tools, no
    # supervisor) on a Redis of their own persisted with AOF
    with (
        PrivateRedis(tmp_path / "redis") as server,
        isolated_settings(services, tmp_path, redis_url=server.url) as settings,
        LoopbackLLM() as llm,
    ):
        client = Client(settings)
        llm_worker = WorkerProcess(settings, "llm", "-Q", "llm,control", "-P", "threads", "-c", "4")
        tools_worker = WorkerProcess(settings, "tools", "-Q", "tools", "-P", "prefork", "-c", "2")
        try:
            llm_worker.wait_ready(client, 120)
            tools_worker.wait_ready(client, 120)
            # and a model call and a tool in flight
            thinking, sleeping = _calls_in_flight(client, llm, llm_worker, tools_worker)

            # When Redis is killed -9 and comes back 2 s later
            server.kill()
            time.sleep(2)
            server.start()

            # Then both jobs complete, each call made once, every worker up
            _calls_survived(client, llm, (thinking, sleeping), (llm_worker, tools_worker), 90)
            # and every message was acknowledged (the calls that ran across
            # the restart acked theirs once they ended): none would be
            # handed out again after the visibility timeout
            broker = redis.Redis.from_url(server.url)
            unacked = f"{settings.redis_prefix}:unacked"
            _wait("every message acknowledged", lambda: broker.hlen(unacked) == 0, 30)

            # When the workers' connections are cut while Redis stays up (a
            # proxy or the network dropping them) with a tool running
            cut = client.submit("fleet-batch", "1 5")
            _wait_running_tool(client, cut.conversation_id, tools_worker)
            assert broker.client_kill_filter(_type="normal", skipme=True) > 0
            # Then the worker reconnects and keeps the running tool's message
            # (kombu put it back on its queue, and a second slot ran the tool
            # again at once): the tool runs once and the job completes
            assert cut.result(timeout=60) == "slept 1"
            assert [c.attempts for c in _tool_calls(client, cut.conversation_id)] == [1]
            _wait("every message acknowledged", lambda: broker.hlen(unacked) == 0, 30)
            _alive(llm_worker, tools_worker)
        finally:
            llm_worker.stop()
            tools_worker.stop()
            client.close()
    for line in llm_worker.log_path.read_text(errors="replace").splitlines():
        assert "Unrecoverable error" not in line, line


def _envelope(headers: object, **properties: object) -> bytes:
    """A kombu envelope as a Celery client would push it, except what is given."""
    props = {
        "body_encoding": "base64",
        "delivery_tag": "crafted-tag",
        "delivery_info": {"exchange": "", "routing_key": "control"},
        **properties,
    }
    message = {
        "body": "W1tdLCB7fSwge31d",  # [[], {}, {}]
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": props,
    }
    return json.dumps(message).encode()


#: Pushed onto a queue's list: none is a message a worker can deliver.
UNDELIVERABLE = [
    b"\x00\xff this is not JSON",
    b"{}",  # no properties (kombu's KeyError, which it takes for a lost connection)
    b"[1, 2]",
    b'"a string"',
    b"[" * 100_000 + b"]" * 100_000,  # nested past the recursion limit
    _envelope({}, delivery_info=None),  # nowhere to acknowledge it
    _envelope({"task": ["chorus.step"]}),  # a task name Celery cannot look up
]


@pytest.mark.long
@pytest.mark.timeout(180)
def test_undeliverable_messages_are_logged_counted_and_dropped(
    services: Services, tmp_path: Path
) -> None:
    # Given a worker of its own
    with isolated_settings(services, tmp_path) as settings:
        client = Client(settings)
        worker = WorkerProcess(settings, "all", "-Q", "llm,control,tools", "-P", "threads")
        try:
            worker.wait_ready(client, 120)
            counter = dropped_messages(settings.redis_prefix)

            # When bytes that are not a message land on its queues
            broker = push_onto_queues(settings, UNDELIVERABLE)

            # Then it drops each one, counting it, and stays up
            _wait(
                "every message dropped",
                lambda: int(broker.get(counter) or 0) == len(UNDELIVERABLE),
                60,
                worker,
            )
            # none is left among the unacknowledged messages
            assert broker.hlen(f"{settings.redis_prefix}:unacked") == 0
            # it still runs jobs
            assert client.submit("fleet-batch", "2 0.1").result(timeout=60) == "slept 2"
            _alive(worker)
            # and the metrics exporter reports the count
            families = {f.name: f for f in ChorusCollector(client.runtime).collect()}
            [sample] = families["chorus_broker_messages_dropped"].samples
            assert sample.value == len(UNDELIVERABLE)
        finally:
            worker.stop()
            client.close()
    log = worker.log_path.read_text(errors="replace")
    assert log.count("dropped a broker message that cannot be decoded") == len(UNDELIVERABLE)
    assert "Unrecoverable error" not in log
    assert "Connection to broker lost" not in log  # no message passes for a lost connection


@pytest.mark.parametrize("stopping", [None, 0], ids=["connection-lost", "warm-shutdown"])
def test_a_closing_channel_keeps_the_messages_of_running_tasks_unless_the_worker_stops(
    services: Services, monkeypatch: pytest.MonkeyPatch, stopping: int | None
) -> None:
    # Given a channel holding two unacknowledged messages, one of a task
    # that runs in this worker
    prefix = f"{services.redis_prefix}-qos-{stopping}"
    app = make_celery(Settings(redis_url=services.redis_url, redis_prefix=prefix))
    broker = redis.Redis.from_url(services.redis_url)
    with app.connection_for_write() as connection:
        channel = connection.channel()
        queue = Queue("qos", routing_key="qos")
        for body in ("running", "waiting"):
            Producer(channel).publish(body, routing_key="qos", declare=[queue])
        running, waiting = (channel.basic_get("qos", no_ack=False) for _ in range(2))
        monkeypatch.setattr(state, "active_requests", [SimpleNamespace(message=running)])
        # (state.should_stop is the exit status once a warm shutdown began: 0)
        monkeypatch.setattr(state, "should_stop", stopping)

        # When the channel's messages are restored (as its close does)
        channel.qos.restore_unacked()

    # Then the waiting one is back on its queue; the running one stays
    # unacknowledged for its task to acknowledge, unless the worker stops
    queued = [json.loads(m)["body"] for m in broker.lrange(f"{prefix}:qos", 0, -1)]
    unacked = broker.hkeys(f"{prefix}:unacked")
    if stopping is None:
        assert len(queued) == 1 and unacked == [running.delivery_tag.encode()]
    else:
        assert len(queued) == 2 and unacked == []
    assert waiting.delivery_tag.encode() not in unacked
