"""Small Kafka client helpers for tests: create topics, produce, and consume everything by assign()."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from replicator import provenance


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
            msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
            tuple(msg.headers() or ()), msg.timestamp()[1],
        )  # fmt: skip


def wait_for(condition: Callable[[], object], timeout: float = 30.0, interval: float = 0.1, what: str = "") -> object:
    """Poll `condition` until it returns a truthy value; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(interval)


def create_topics(bootstrap: str, topics: dict[str, int], config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(t, n, 1, config=config or {}) for t, n in topics.items()])
    for future in futures.values():
        future.result(timeout=30)
    wait_for(lambda: all(t in admin.list_topics(timeout=5).topics for t in topics), what=f"topics {list(topics)}")


def delete_topics(bootstrap: str, topics: Iterable[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(list(topics)).values():
        future.result(timeout=30)


def produce(bootstrap: str, records: Iterable[dict], **config: object) -> None:
    """Produce dicts of Producer.produce() arguments and wait until every one is acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, **config})
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


def consume_all(
    bootstrap: str,
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
        {"bootstrap.servers": bootstrap, "group.id": "tests-reader", "enable.auto.commit": False,
         "enable.partition.eof": False},
    )  # fmt: skip
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


def replicated_headers(
    headers: list[tuple[str, bytes | None]] | None,
    origin: str,
    source_cluster: str,
    topic: str,
    partition: int,
    offset: int,
) -> list[tuple[str, bytes | None]]:
    """A record's headers as the engine writes them on a copy: the user's, then this hop's provenance."""
    return [
        *provenance.user_headers(headers),
        (provenance.ORIGIN, origin.encode()),
        (provenance.SOURCE, provenance.source_prefix(source_cluster, topic, partition) + b"%d" % offset),
    ]  # fmt: skip
