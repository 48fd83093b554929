"""A connector's throttle holds its tasks to a rate of records or bytes a second, and a new limit applies live."""

from __future__ import annotations

import threading
import time

from confluent_kafka import Consumer, TopicPartition

from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.configuration import administration
from replicator.engine.task import TaskExit
from replicator.state.store import Store
from tests.fixtures.engine_helpers import TaskThread, connector_properties, create_connector
from tests.fixtures.kafka_helpers import create_topics, produce

VALUE_BYTES = 1000


class ArrivalClock:
    """Reads a destination topic from its start in a thread and notes when each copy arrived (monotonic)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "tests-throttle", "enable.auto.commit": False}
        )
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self.arrivals: list[float] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="arrivals")
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            for msg in self.consumer.consume(1000, 0.05):
                if msg.error() is None:
                    self.arrivals.append(time.monotonic())
        self.consumer.close()

    def rate(self, first: int, last: int) -> float:
        """Copies a second between the `first` and the `last` copy to arrive."""
        return (last - first) / (self.arrivals[last] - self.arrivals[first])

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(10)


def test_a_throttle_holds_the_rate_and_a_new_limit_applies_without_new_clients(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    topic, total = unique, 5000
    create_topics(stack.source_bootstrap_servers, {topic: 2})
    create_topics(stack.destination_bootstrap_servers, {topic: 2})
    padding = b"x" * (VALUE_BYTES - 8)
    produce(
        stack.source_bootstrap_servers,
        ({"topic": topic, "partition": i % 2, "value": b"%08d" % i + padding} for i in range(total)),
    )
    properties = connector_properties(
        stack, unique, **{"topics.whitelist": topic, "replication.throttle.records.per.second": 400}
    )
    create_connector(store, properties, {0: [(topic, 0), (topic, 1)]})
    clock = ArrivalClock(stack.destination_bootstrap_servers, topic, 2)
    runner = TaskThread.start(store, unique)
    try:
        wait_until(lambda: len(clock.arrivals) >= 1600, timeout=30, what="1,600 copies")
        # A backlog of 5,000 records, read at 400 a second (the first 200 include the burst a bucket starts with).
        assert 320 <= clock.rate(200, 1500) <= 480

        # Now by bytes: 1 MB/s of 1,000-byte values, about 1,000 records a second, with the same clients.
        faster = {"replication.throttle.records.per.second": 0, "replication.throttle.bytes.per.second": 1_000_000}
        administration.put_connector(store, {**properties, **faster})
        wait_until(lambda: len(clock.arrivals) >= total, timeout=30, what="every copy")
        kept = "configuration version 2: throttle changed, clients kept"
        wait_until(lambda: kept in runner.events, timeout=5, what="the new limit, applied in place")
        assert not any("restarting clients" in e for e in runner.events)
        assert 800 <= clock.rate(total - 2500, total - 1) <= 1200
        assert runner.finish() is TaskExit.STOPPED
    finally:
        runner.stop.set()
        clock.stop()
