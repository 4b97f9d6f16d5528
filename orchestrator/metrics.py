"""Prometheus metrics of Chorus, exported by ``chorus metrics``.

The exporter is one stateless process beside the fleet: on each scrape it
reads the events stored since the previous scrape (Postgres is the source
of truth, so every worker's work counts, whatever its pool) and the depth
of each Celery queue in Redis, with the number of workers reading it
(:mod:`orchestrator.readers`). Counters start from the whole history at
exporter start, so a restart never makes them go down.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import redis
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlmodel import col, select

from orchestrator.keys import dropped_messages
from orchestrator.readers import QueueState, known_queues, queue_states
from orchestrator.runtime import Runtime
from orchestrator.store.tables import EventRow

BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TURN_OUTCOMES = {
    "turn.started": "started",
    "turn.completed": "completed",
    "turn.failed": "failed",
    "turn.cancelled": "cancelled",
}
_TOOL_OUTCOMES = {"tool.completed": "completed", "tool.failed": "failed"}


@dataclass
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    total: float = 0.0

    def observe(self, value: float) -> None:
        self.total += value
        for i, bound in enumerate(BUCKETS):
            if value <= bound:
                self.counts[i] += 1
        self.counts[-1] += 1

    def family(self, name: str, doc: str) -> HistogramMetricFamily:
        buckets = [(str(b), c) for b, c in zip(BUCKETS, self.counts, strict=False)]
        buckets.append(("+Inf", self.counts[-1]))
        return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=self.total)


@dataclass
class Totals:
    """Everything counted from the events read so far."""

    last_id: int = 0
    turns: Counter[str] = field(default_factory=Counter)
    tools: Counter[str] = field(default_factory=Counter)
    model_calls: Counter[str] = field(default_factory=Counter)
    tokens: Counter[str] = field(default_factory=Counter)
    cost_usd: float = 0.0
    model_seconds: Histogram = field(default_factory=Histogram)
    step_seconds: Histogram = field(default_factory=Histogram)

    def add(self, name: str, data: Mapping[str, object]) -> None:
        if name in _TURN_OUTCOMES:
            self.turns[_TURN_OUTCOMES[name]] += 1
        elif name in _TOOL_OUTCOMES:
            self.tools[_TOOL_OUTCOMES[name]] += 1
        elif name == "llm.completed":
            self.model_calls["completed"] += 1
            self.model_seconds.observe(_number(data.get("seconds")))
            if "step_seconds" in data:
                self.step_seconds.observe(_number(data.get("step_seconds")))
        elif name == "llm.failed":
            self.model_calls["failed"] += 1
        elif name == "usage":
            self.tokens["input"] += int(_number(data.get("input_tokens")))
            self.tokens["output"] += int(_number(data.get("output_tokens")))
            self.cost_usd += _number(data.get("cost_usd"))


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


class ChorusCollector(Collector):
    """Reads new events and queue depths at every scrape."""

    def __init__(self, rt: Runtime, batch: int = 10_000) -> None:
        self.rt = rt
        self.batch = batch
        self.totals = Totals()
        self._lock = threading.Lock()

    def _catch_up(self) -> None:
        while True:
            with self.rt.session() as session:
                rows = session.exec(
                    select(EventRow.id, EventRow.name, EventRow.data)
                    .where(col(EventRow.id) > self.totals.last_id)
                    .order_by(col(EventRow.id))
                    .limit(self.batch)
                ).all()
            for row_id, name, data in rows:
                self.totals.add(name, data or {})
                self.totals.last_id = row_id or self.totals.last_id
            if len(rows) < self.batch:
                return

    def _queues(self) -> list[QueueState]:
        try:
            return queue_states(self.rt, known_queues())
        except redis.RedisError:
            return []

    def _dropped_messages(self) -> int | None:
        try:
            value = self.rt.redis.get(dropped_messages(self.rt.settings.redis_prefix))
            return int(value or 0)
        except (redis.RedisError, ValueError):  # not a counter: report none
            return None

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            self._catch_up()
            t = self.totals
            yield _counter("chorus_turns", "Turns by outcome.", "outcome", t.turns)
            yield _counter("chorus_tool_calls", "Tool calls by outcome.", "outcome", t.tools)
            yield _counter(
                "chorus_model_calls", "Model calls by outcome.", "outcome", t.model_calls
            )
            yield _counter("chorus_tokens", "Model tokens by kind.", "kind", t.tokens)
            cost = CounterMetricFamily("chorus_cost_usd", "Model cost in USD (litellm prices).")
            cost.add_metric([], t.cost_usd)
            yield cost
            yield t.model_seconds.family("chorus_model_call_seconds", "Model call latency.")
            yield t.step_seconds.family("chorus_step_seconds", "Step latency (chorus.step task).")
            depth = GaugeMetricFamily("chorus_queue_depth", "Messages waiting.", labels=["queue"])
            readers = GaugeMetricFamily(
                "chorus_queue_readers",
                "Workers reading the queue (0 with messages waiting: they wait for good).",
                labels=["queue"],
            )
            for queue in self._queues():
                depth.add_metric([queue.queue], queue.waiting)
                readers.add_metric([queue.queue], queue.readers)
            yield depth
            yield readers
            dropped = self._dropped_messages()
            if dropped is not None:
                family = CounterMetricFamily(
                    "chorus_broker_messages_dropped",
                    "Broker messages workers dropped: they could not be decoded or delivered.",
                )
                family.add_metric([], dropped)
                yield family


def _counter(name: str, doc: str, label: str, values: Counter[str]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


def serve(rt: Runtime, host: str, port: int) -> None:
    """Serve ``/metrics`` until the process is stopped."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    registry.register(ChorusCollector(rt))
    server, thread = start_http_server(port, addr=host, registry=registry)
    try:
        thread.join()
    finally:
        server.shutdown()
