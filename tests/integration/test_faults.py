"""Fault injection: every job ends, every tool call has one result, whatever dies.

(a) fan-out conversations (model -> 3 parallel tools + a barrier -> model)
    while a loop SIGKILLs a random worker's process group, with beat
    sweeping and messages sent mid-run; the full size (100 conversations,
    50 kills, 50 messages) runs with ``-m slow``, a reduced one by default;
(b) a model call silent for longer than the lease and the broker's
    visibility timeout reaches the provider once;
(c) Redis (AOF, as compose runs it) and Postgres restarted mid-run;
(d) a step that fails the same way every time fails its turn in bounded time.

Run with ``-s`` to see the figures: time with and without faults,
re-executions, duplicates and lost work.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator import ChorusError, Client, JobFailedError, Settings
from orchestrator.llm.scripted import scripted_model
from schemas import AgentSpec, EventName, TurnStatus
from tests.conftest import WorkerProcess
from tests.faults import (
    ONE_WORKER,
    Figures,
    Fleet,
    PrivateCluster,
    PrivateRedis,
    account,
    chaos_expected,
    count_model_calls,
    isolated_settings,
    running_fleet,
    unacked,
    wait_for_running_tools,
    wait_turns,
)
from tests.loopback_llm import LoopbackLLM
from tests.services import Services

pytestmark = pytest.mark.integration

LLM_WORKER = ("-Q", "llm,control", "-P", "threads", "-c", "8")
TOOLS_WORKER = ("-Q", "tools", "-P", "prefork", "-c", "2")
#: Two I/O workers and two tool workers: a kill takes out a quarter of the fleet.
CHAOS_FLEET = {
    "llm-a": LLM_WORKER,
    "llm-b": LLM_WORKER,
    "tools-a": TOOLS_WORKER,
    "tools-b": TOOLS_WORKER,
}
#: The default run's fleet: one of each (fewer processes to start on a busy machine).
SMALL_FLEET = {"llm": LLM_WORKER, "tools": ("-Q", "tools", "-P", "prefork", "-c", "3")}
TOOLS_PER_TURN = 4  # 3 parallel + 1 barrier


def _chaos_run(
    client: Client,
    fleet: Fleet,
    settings: Settings,
    *,
    tag: str,
    conversations: int,
    kills: int,
    messages: int,
    window: float,
    timeout: float,
) -> Figures:
    """Submit ``conversations``, send ``messages`` spread over ``window``
    seconds while ``kills`` workers are killed over the same window, wait
    for every turn and account for it."""
    seed = random.randrange(1 << 30)
    print(f"\n[faults] {tag}: random seed {seed}")
    rng, kill_rng = random.Random(seed), random.Random(seed + 1)
    began = time.monotonic()
    inputs = [f"{tag}-c{i}" for i in range(conversations)]
    jobs = [client.submit("chaos", text) for text in inputs]
    convs = [j.conversation_id for j in jobs]
    kills_before = fleet.kills
    killer = None
    if kills:
        killer = threading.Thread(target=fleet.kill_loop, args=(kills, window / kills, kill_rng))
        killer.start()
    sent = []
    for k in range(messages):
        time.sleep(max(0.0, began + window * (k + 1) / (messages + 1) - time.monotonic()))
        text = f"{tag}-m{k}"
        client.send(rng.choice(convs), text)
        sent.append(text)
    if killer is not None:
        killer.join()
    wait_turns(client, convs, conversations + messages, timeout, fleet)
    figures = Figures(tag, seconds=time.monotonic() - began, kills=fleet.kills - kills_before)
    account(client, figures, convs, chaos_expected(inputs + sent), TOOLS_PER_TURN)
    count_model_calls(figures, settings, tag)
    figures.restarts = fleet.restarts
    figures.unacked = unacked(settings)
    return figures


def _chaos(
    services: Services,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    workers: dict[str, tuple[str, ...]],
    conversations: int,
    kills: int,
    messages: int,
    window: float,
    calm_window: float | None = None,
    tool_seconds: float = 1.0,
    **overrides: float,
) -> None:
    monkeypatch.setenv("CHORUS_TEST_CHAOS_TOOL_SECONDS", str(tool_seconds))
    # A step whose worker died (or whose copy failed) while it held its
    # conversation's lease is taken again once the lease expires: after
    # 10 s, not the default 60 s (the heartbeat renews a lease every
    # third of the stall timeout while its model call runs)
    monkeypatch.setenv("CHORUS_LEASE_SECONDS", "10")
    with (
        isolated_settings(services, tmp_path, **overrides) as settings,
        running_fleet(settings, workers) as (client, fleet),
    ):
        size: dict[str, Any] = dict(
            conversations=conversations,
            messages=messages,
            window=window,
            timeout=max(150.0, 3 * window),  # a loaded machine recovers slowly
        )
        # Given a baseline of the same size with no fault
        calm_size = {**size, "window": calm_window or window}
        calm = _chaos_run(client, fleet, settings, tag="calm", kills=0, **calm_size)
        calm.report()
        # When workers are SIGKILLed throughout a run of the same size
        hurt = _chaos_run(client, fleet, settings, tag="kill", kills=kills, **size)
        hurt.report()
    # Then nothing was lost or done twice, with or without faults
    assert hurt.kills == kills
    for figures in (calm, hurt):
        assert figures.turns == conversations + messages
        assert figures.model_steps == 2 * (conversations + messages)
        assert figures.duplicates == [] and figures.lost == [], figures.line()


@pytest.mark.long
@pytest.mark.timeout(420)
def test_kill9_workers_during_fanout_runs_reduced(
    services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _chaos(
        services,
        tmp_path,
        monkeypatch,
        workers=SMALL_FLEET,
        conversations=10,
        kills=4,
        messages=5,
        window=16.0,
        # its messages still arrive mid-run, sooner
        calm_window=4.0,
        # each tool sleeps 0.5 s (the barrier 0.25 s): the three tool
        # processes are busy all run long, so every kill of them still
        # finds tools running
        tool_seconds=0.5,
        # a lost step or tool call is re-sent 4 s after its last progress,
        # not 8 s
        stall_timeout=4.0,
        sweep_interval=1.0,
    )


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_kill9_workers_during_fanout_runs_full(
    services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _chaos(
        services,
        tmp_path,
        monkeypatch,
        workers=CHAOS_FLEET,
        conversations=100,
        kills=50,
        messages=50,
        window=200.0,
    )


# -- (b) a silent model call longer than the lease and the visibility timeout --

#: Seconds before the provider's first byte: more than the visibility
#: timeout (2 s) plus kombu's restore interval of unacked messages (10 s,
#: orchestrator.celery_conf), so a restore hands the message out again
#: during the call.
SILENCE = 16.0


@pytest.mark.long
@pytest.mark.timeout(240)
def test_a_silent_model_call_longer_than_the_lease_is_made_once(
    services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a fleet whose lease (3 s), stall timeout (4 s) and broker
    # visibility timeout (2 s) are all far shorter than the model call
    monkeypatch.setenv("CHORUS_LEASE_SECONDS", "3")
    monkeypatch.setenv("CHORUS_VISIBILITY_TIMEOUT", "2")
    with (
        isolated_settings(services, tmp_path, stall_timeout=4.0, sweep_interval=1.0) as settings,
        running_fleet(settings, ONE_WORKER) as (client, fleet),
        LoopbackLLM() as server,
    ):
        # and a provider that thinks 16 s before answering with a tool call only
        server.enqueue_tool_calls([("add", {"a": 2, "b": 40})], delay=SILENCE)
        server.enqueue_text("The sum is 42.")
        spec = AgentSpec(
            name="silent-thinker",
            model="openai/loopback-model",
            tools=("add",),
            model_settings={"api_base": server.base_url},
        )
        began = time.monotonic()
        job = client.submit(spec, "What is 2 + 40?")

        # When the turn runs to its end
        try:
            answer = job.result(timeout=SILENCE + 90)
        except JobFailedError as exc:
            answer = f"failed: {exc}"
        seconds = time.monotonic() - began
        received = len(server.received)
        print(
            f"\n[faults] silent call: {SILENCE:.0f}s silence, {received} requests, {seconds:.1f}s"
        )

    # Then the provider got the slow request exactly once: the second request
    # is the tool round after it, not a copy of it
    assert received == 2, f"the provider received {received} requests, not 2 ({answer})"
    second = server.requests[1]["messages"]
    assert [m["content"] for m in second if m["role"] == "tool"] == ["42"], (
        f"the second request was a re-sent copy of the silent one ({answer})"
    )
    # and the turn completed with the answer, after the whole silence
    assert answer == "The sum is 42."
    assert seconds >= SILENCE
    # and the broker did hand the step's message out again during the call
    log = fleet.procs["all"].log_path.read_text(errors="replace")
    step = f"chorus.step[step:{job.conversation_id}:{job.id}:0] received"
    assert log.count(step) >= 2, "no redelivery after the visibility timeout"


# -- (c) Redis and Postgres restarted mid-run -----------------------------------

SERVICE_RUN = 6  # conversations in flight when the service goes down


def _service_run(client: Client, fleet: Fleet, settings: Settings, tag: str, outage: Any) -> None:
    began = time.monotonic()
    inputs = [f"{tag}-c{i}" for i in range(SERVICE_RUN)]
    convs = [client.submit("chaos", text).conversation_id for text in inputs]
    wait_for_running_tools(client, convs, timeout=60)
    outage()
    wait_turns(client, convs, SERVICE_RUN, timeout=180, fleet=fleet)
    figures = Figures(tag, seconds=time.monotonic() - began)
    account(client, figures, convs, chaos_expected(inputs), TOOLS_PER_TURN)
    count_model_calls(figures, settings, tag)
    figures.restarts = fleet.restarts
    figures.report()
    assert figures.duplicates == [] and figures.lost == [], figures.line()


@pytest.mark.long
@pytest.mark.timeout(360)
def test_redis_and_postgres_restarted_mid_run(
    services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHORUS_TEST_CHAOS_TOOL_SECONDS", "2.0")
    # A step whose execution failed during the outage while it held its
    # conversation's lease cannot give the lease up (the database is what
    # failed): its retry takes the lease over. With a lease of 10 minutes,
    # a retry that waited for it to expire would not finish in this test.
    monkeypatch.setenv("CHORUS_LEASE_SECONDS", "600")
    # Given a fleet on a Redis of its own, persisted with AOF as compose runs
    # it, and on a Postgres cluster of its own
    with (
        PrivateRedis(tmp_path / "redis") as redis_server,
        PrivateCluster() as cluster,
        isolated_settings(
            services,
            tmp_path,
            redis_url=redis_server.url,
            database_url=cluster.url,
            # what the outage lost is re-sent 4 s after its last progress
            # (a tool takes 2 s), not 8 s
            stall_timeout=4.0,
            sweep_interval=1.0,
        ) as settings,
        running_fleet(settings, ONE_WORKER) as (client, fleet),
    ):

        def restart_redis() -> None:
            redis_server.kill()
            time.sleep(2)
            redis_server.start()

        # When Redis is killed while tools run, and comes back 2 s later
        # Then every job completes, each tool call with one result
        _service_run(client, fleet, settings, "redis", restart_redis)
        # When Postgres restarts while tools run: the same
        _service_run(client, fleet, settings, "postgres", cluster.restart)
        # When Postgres is down while a model call runs (its step holds the lease)
        _down_during_model_call(client, cluster)


def _down_during_model_call(client: Client, cluster: PrivateCluster) -> None:
    job = client.submit("slow-answer", "under an outage")
    for event in job.events(deltas=False, timeout=60):
        if event.name == EventName.LLM_REQUESTED:
            break
    # Postgres stops mid-call and stays down past the model's answer (5 s after
    # its request): storing the reply fails, and so does giving the lease up;
    # the first retries (1 s, 2 s later) fail too, before they take the lease
    cluster.stop()
    time.sleep(8)
    cluster.start()
    # Then a retry takes over the lease the failed execution held (600 s
    # left on it) and the job completes, its model called again
    wait_turns(client, [job.conversation_id], 1, timeout=90)
    assert job.result(timeout=10) == "slow: under an outage"
    names = [e.name for e in job.events(deltas=False, timeout=5)]
    assert names.count(EventName.LLM_REQUESTED) == 2, names
    assert names.count(EventName.TURN_COMPLETED) == 1, names


# -- (d) a deterministic error in a step ---------------------------------------


@pytest.mark.timeout(180)
def test_a_step_that_always_fails_ends_its_turn(
    settings: Settings, client: Client, workers: dict[str, WorkerProcess]
) -> None:
    # Given beat sweeping, and an agent whose context transformer always raises
    fleet = Fleet(settings, client, {}, beat=True)
    spec = AgentSpec(
        name="always-fails",
        model=scripted_model("never-reached"),
        context=("always_fails",),
    )
    try:
        began = time.monotonic()
        job = client.submit(spec, "hello")
        # When its turn runs, Then it fails (not an endless re-dispatch) in bounded time
        with pytest.raises(ChorusError) as caught:
            job.result(timeout=60)
        seconds = time.monotonic() - began
    finally:
        fleet.stop()
    print(f"\n[faults] deterministic step error: turn ended in {seconds:.1f}s: {caught.value}")
    status = job.status()
    assert status.status is TurnStatus.FAILED
    assert "always_fails" in (status.error or "")
    names = [e.name for e in job.events(deltas=False, timeout=5)]
    assert names.count(EventName.TURN_FAILED) == 1
    assert EventName.LLM_COMPLETED not in names
