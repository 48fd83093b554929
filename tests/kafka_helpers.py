"""Small Kafka client helpers for tests: create topics, produce (at once or as background traffic), consume
everything by assign(), and a cluster's id."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from mirus.waiting import wait_until

Cluster = str | Mapping[str, str]  # bootstrap servers, or a client's whole settings (a secured cluster)


def client_settings(cluster: Cluster) -> dict[str, str]:
    return {"bootstrap.servers": cluster} if isinstance(cluster, str) else dict(cluster)


@dataclass(frozen=True)
class Rec:
    """A record as a user sees it, for comparisons between clusters."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int

    @classmethod
    def of(cls, msg: Message) -> Rec:
        return cls(
            msg.topic(),
            msg.partition(),
            msg.offset(),
            msg.key(),
            msg.value(),
            tuple(msg.headers() or ()),
            msg.timestamp()[1],
        )


def create_topics(bootstrap: Cluster, topics: dict[str, int], config: dict[str, str] | None = None) -> None:
    admin = AdminClient(client_settings(bootstrap))
    futures = admin.create_topics([NewTopic(t, n, 1, config=config or {}) for t, n in topics.items()])
    for future in futures.values():
        future.result(timeout=30)
    wait_until(lambda: all(t in admin.list_topics(timeout=5).topics for t in topics), what=f"topics {list(topics)}")


def delete_topics(bootstrap: str, topics: Iterable[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(list(topics)).values():
        future.result(timeout=30)


def cluster_id(bootstrap: str) -> str:
    return AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).cluster_id


def produce(bootstrap: Cluster, records: Iterable[dict], **config: object) -> None:
    """Produce dicts of Producer.produce() arguments and wait until every one is acknowledged."""
    producer = Producer({**client_settings(bootstrap), "enable.idempotence": True, "linger.ms": 5, **config})
    errors: list[object] = []

    def on_delivery(err: object, _msg: Message) -> None:
        if err is not None:
            errors.append(err)

    for record in records:
        while True:
            try:
                producer.produce(on_delivery=on_delivery, **record)
                break
            except BufferError:
                producer.poll(0.1)
    remaining = producer.flush(60)
    assert remaining == 0 and not errors, f"produce failed: {remaining} unacknowledged, errors {errors[:3]}"


def numbered(topic: str, partition: int, i: int) -> dict:
    """The i-th record of `Traffic` unless told otherwise: its number as the value, for ordering checks."""
    return {"topic": topic, "partition": partition, "value": b"%08d" % i}


class Traffic:
    """Records produced in a background thread, round-robin over every partition of `topics`, about `rate` a
    second, until `stop()` (or until `total` records were produced: then `join()` waits for them).

    `record(topic, partition, i)` gives the i-th record's Producer.produce() arguments. Only acknowledged records
    count: `written` is how many there are, `acked` the highest acknowledged offset per partition. `stop()` and
    `join()` fail if a record was refused or left unacknowledged."""

    def __init__(
        self,
        bootstrap: str,
        topics: Mapping[str, int],
        *,
        rate: float,
        total: int | None = None,
        record: Callable[[str, int, int], dict] = numbered,
    ) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
        self.targets = [(t, p) for t, n in sorted(topics.items()) for p in range(n)]
        self.rate, self.total, self.record = rate, total, record
        self.written = 0
        self.acked: dict[tuple[str, int], int] = {}
        self.errors: list[str] = []
        self.lock = threading.Lock()  # delivery reports also run in the test's thread (`snapshot`)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="traffic")
        self.thread.start()

    def _delivered(self, err: object, msg: Message) -> None:
        with self.lock:
            if err is not None:
                self.errors.append(str(err))
                return
            tp = (msg.topic(), msg.partition())
            self.acked[tp] = max(self.acked.get(tp, -1), msg.offset())
            self.written += 1

    def _run(self) -> None:
        started = time.monotonic()
        for i in range(self.total) if self.total is not None else itertools.count():
            topic, partition = self.targets[i % len(self.targets)]
            while True:
                try:
                    self.producer.produce(on_delivery=self._delivered, **self.record(topic, partition, i))
                    break
                except BufferError:
                    self.producer.poll(0.1)
            self.producer.poll(0)
            # Pacing the producer, not waiting for a condition.
            if self.stopped.wait(max(0.0, started + (i + 1) / self.rate - time.monotonic())):
                break
        if unacknowledged := self.producer.flush(60):
            self.errors.append(f"{unacknowledged} records unacknowledged after 60s")

    @property
    def running(self) -> bool:
        return self.thread.is_alive()

    def snapshot(self) -> dict[tuple[str, int], int]:
        """The highest acknowledged offset per partition, as of now."""
        self.producer.poll(0)
        with self.lock:
            return dict(self.acked)

    def stop(self) -> int:
        """Stop producing; returns how many records were written, every one acknowledged."""
        self.stopped.set()
        return self.join()

    def join(self, timeout: float = 120.0) -> int:
        """Wait until the traffic ended (all `total` records, or stopped); returns how many were written."""
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"traffic still producing after {timeout}s"
        assert not self.errors, f"traffic into {self.targets[0][0]}: {self.errors[:3]}"
        return self.written


def consume_all(
    bootstrap: Cluster,
    topic: str,
    partitions: int,
    expected: int,
    timeout: float = 60.0,
    distinct: Callable[[Rec], object] | None = None,
) -> list[Rec]:
    """Read `topic` from the beginning until `expected` records arrived (fails on timeout), then drain briefly.

    `distinct`: count records by this key (e.g. the source record a copy is of), so that duplicates of an
    at-least-once replay do not end the read before every record was seen: the brief drain after it is no
    guarantee to catch up. Watermarks are never used to count: some Kafka-protocol brokers report them wrongly.
    """
    consumer = Consumer(
        {
            **client_settings(bootstrap),
            "group.id": "tests-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        },
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records: list[Rec] = []
    seen: set[object] = set()
    deadline = time.monotonic() + timeout
    try:
        while (len(seen) if distinct else len(records)) < expected:
            if time.monotonic() > deadline:
                counted = f"{len(seen)} distinct ({len(records)} in all)" if distinct else f"{len(records)}"
                raise AssertionError(f"{topic}: {counted} of {expected} records after {timeout}s")
            for msg in consumer.consume(1000, 0.5):
                if msg.error():
                    raise KafkaException(msg.error())
                records.append(Rec.of(msg))
                if distinct:
                    seen.add(distinct(records[-1]))
        # Anything beyond `expected` (duplicates) must show up too.
        for msg in consumer.consume(1000, 1.0):
            if not msg.error():
                records.append(Rec.of(msg))
    finally:
        consumer.close()
    return records
