"""Partitions copied as record batches (`replicator/batches/copier.py`) between the suite's Apache Kafka 1.0 clusters
(`apache_kafka`), and what the embedded broker (Tansu) does with the same produce requests.

Copies are compared with their sources as a consumer reads them (confluent-kafka: keys, values, headers, timestamps,
offsets), and the destination's batches as the broker keeps them (a raw fetch: compression, producer id, batch
boundaries)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from mirus.faults.brokers import tansu_broker
from mirus.local.stack import free_port
from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.batches.copier import UNKNOWN_OFFSET, BatchCopier, Segment, Step, merged
from replicator.batches.record_batch import Reason, RecordBatch, split
from replicator.batches.wire import KafkaWire, Partition
from tests.fixtures.batch_helpers import compacted_with_gaps
from tests.fixtures.kafka_helpers import Rec, consume_all, create_topics, produce

LIMIT = 1_000_012  # Kafka's default max.message.bytes
LZ4 = 3


def copy_all(copier: BatchCopier, records: int, timeout: float = 60.0) -> list[Step]:
    """Steps until `records` records were copied; no step may report a problem or hand a batch back."""
    steps: list[Step] = []

    def copied() -> bool:
        steps.append(copier.step())
        assert not steps[-1].problems and not steps[-1].handed_back, steps[-1]
        return sum(step.records for step in steps) >= records

    wait_until(copied, timeout, interval=0, what=f"{records} records copied")
    return steps


def segments(steps: list[Step], partition: Partition) -> list[Segment]:
    return merged(segment for step in steps for segment in step.segments.get(partition, []))


def raw_batches(wire: KafkaWire, topic: str, partitions: int) -> dict[int, list[RecordBatch]]:
    """Every batch of `topic` as the broker keeps it (read_committed), by partition."""
    fetched = wire.fetch({Partition(topic, p): 0 for p in range(partitions)}, partition_max_bytes=4_000_000)
    assert not [f.problem for f in fetched.values() if f.problem]
    return {p.partition: split(f.records)[0] for p, f in fetched.items()}


def as_read(records: list[Rec]) -> list[tuple]:
    """A topic's records as a reader sees them, partition by partition, without the topic's name."""
    return sorted((r.partition, r.offset, r.key, r.value, r.headers, r.timestamp) for r in records)


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_partitions_copied_as_batches_read_as_their_sources(
    apache_kafka: StackEndpoints, wires: tuple[KafkaWire, KafkaWire], unique: str, compression: str
) -> None:
    source, destination = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    create_topics(source, {unique: 2})
    create_topics(destination, {unique: 2})
    records = [
        {
            "topic": unique,
            "partition": i % 2,
            "key": b"k%d" % i,
            "value": None if i % 500 == 7 else b"%06d." % i * 100,  # 700 bytes, a null value now and then
            "headers": [("n", b"%d" % i), ("dup", b"a"), ("dup", None)],
            "timestamp": 1_600_000_000_000 + i,
        }
        for i in range(4_000)
    ]
    produce(source, records, **{"compression.type": compression, "batch.num.messages": 200})

    copier = BatchCopier(*wires)
    for p in range(2):
        copier.start(Partition(unique, p), 0, unique, LIMIT)
    steps = copy_all(copier, 4_000)

    assert as_read(consume_all(destination, unique, 2, 4_000)) == as_read(consume_all(source, unique, 2, 4_000))
    for p in range(2):
        assert segments(steps, Partition(unique, p)) == [Segment(0, 0, 2_000)]
    # The broker kept the batches as they came: the same boundaries and compression, this platform's producer id.
    originals, copies = raw_batches(wires[0], unique, 2), raw_batches(wires[1], unique, 2)
    for p in range(2):
        assert [(b.base_offset, b.records_count) for b in copies[p]] == [
            (b.base_offset, b.records_count) for b in originals[p]
        ]
        assert {b.compression for b in copies[p]} == {LZ4 if compression == "lz4" else 0}
        assert {b.producer_id for b in copies[p]} == {copier.producer.producer_id}
        assert [b.base_sequence for b in copies[p]] == [b.base_offset for b in copies[p]]
    if compression == "none":
        # A response over kafka-python's default frame limit (1 MB): the wire sizes its frames to its fetches.
        assert steps[0].bytes > 1_000_000


def test_a_transactional_source_loses_its_aborted_records_and_markers(
    apache_kafka: StackEndpoints, wires: tuple[KafkaWire, KafkaWire], unique: str
) -> None:
    source, destination = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    create_topics(source, {unique: 1})
    create_topics(destination, {unique: 1})
    producer = Producer({"bootstrap.servers": source, "transactional.id": unique, "linger.ms": 5})
    producer.init_transactions(30)
    for name, commit in (("first", True), ("aborted", False), ("second", True)):
        producer.begin_transaction()
        for i in range(5):
            producer.produce(unique, b"%s-%d" % (name.encode(), i), key=b"k%d" % i, headers=[("t", name.encode())])
        assert producer.flush(30) == 0  # written before the transaction ends: an abort drops what is queued
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)

    copier = BatchCopier(*wires)
    copier.start(Partition(unique, 0), 0, unique, LIMIT)
    steps = copy_all(copier, 10)

    copies = consume_all(destination, unique, 1, 10)
    assert [r.value for r in copies] == [b"first-%d" % i for i in range(5)] + [b"second-%d" % i for i in range(5)]
    assert [r.headers for r in copies] == [(("t", b"first"),)] * 5 + [(("t", b"second"),)] * 5
    # Source offsets: first 0-4, its marker 5, aborted 6-10, its marker 11, second 12-16, its marker 17.
    assert segments(steps, Partition(unique, 0)) == [Segment(0, 0, 5), Segment(12, 5, 5)]
    assert copier.lanes[Partition(unique, 0)].position == 18  # past the last marker
    kept = raw_batches(wires[1], unique, 1)[0]
    assert not [b for b in kept if b.is_control or b.is_transactional]
    assert [b.records_count for b in kept] == [5, 5]


def test_a_compacted_batch_with_gaps_is_handed_back_where_it_starts(
    apache_kafka: StackEndpoints, wires: tuple[KafkaWire, KafkaWire], unique: str
) -> None:
    compacted_with_gaps(apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers, unique)
    copier = BatchCopier(*wires)
    copier.start(Partition(unique, 0), 0, unique, LIMIT)
    step = copier.step()
    assert step.segments == {Partition(unique, 0): [Segment(0, 0, 5)]}
    handed = step.handed_back[Partition(unique, 0)]
    assert (handed.offset, handed.reason, handed.batch.last_offset_delta) == (5, Reason.GAPS, 9)
    assert Partition(unique, 0) not in copier.lanes  # stopped there: the record path copies it
    assert copier.step().segments == {}


def test_a_batch_that_cannot_pass_stops_its_partition_there(
    apache_kafka: StackEndpoints, wires: tuple[KafkaWire, KafkaWire], unique: str
) -> None:
    source = apache_kafka.source_bootstrap_servers
    create_topics(source, {unique: 2})
    create_topics(apache_kafka.destination_bootstrap_servers, {unique: 2})
    for p in range(2):
        produce(source, [{"topic": unique, "partition": p, "value": b"small"} for _ in range(10)], **{"linger.ms": 20})
        produce(
            source, [{"topic": unique, "partition": p, "value": b"x" * 1_000} for _ in range(20)], **{"linger.ms": 100}
        )
    copier = BatchCopier(*wires)
    copier.start(Partition(unique, 0), 0, unique, 10_000)  # the first batch fits, the second (20 kB) does not
    copier.start(Partition(unique, 1), 5, unique, LIMIT)  # inside the first batch
    step = copier.step()
    assert step.segments == {Partition(unique, 0): [Segment(0, 0, 10)]}
    too_large, partial = step.handed_back[Partition(unique, 0)], step.handed_back[Partition(unique, 1)]
    assert (too_large.offset, too_large.reason, too_large.batch.size > 10_000) == (10, Reason.TOO_LARGE, True)
    assert (partial.offset, partial.reason, partial.batch.base_offset) == (5, Reason.PARTIAL, 0)
    assert copier.lanes == {}
    # The record path copies 5-9 of partition 1; the batch path takes over again after it.
    copier.start(Partition(unique, 1), 10, unique, LIMIT)
    step = copier.step()
    assert step.segments == {Partition(unique, 1): [Segment(10, 0, 20)]}


def test_a_batch_sent_again_with_its_sequence_is_not_copied_twice(
    apache_kafka: StackEndpoints, wires: tuple[KafkaWire, KafkaWire], unique: str
) -> None:
    source, destination = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    create_topics(source, {unique: 1})
    create_topics(destination, {unique: 1})
    produce(source, [{"topic": unique, "value": b"%d" % i} for i in range(300)], **{"batch.num.messages": 100})
    first = BatchCopier(*wires)
    first.start(Partition(unique, 0), 0, unique, LIMIT)
    assert segments(copy_all(first, 300), Partition(unique, 0)) == [Segment(0, 0, 300)]

    # A copier with the same producer id, from the same offset (as after acknowledgements lost to a crash): the
    # same batches with the same sequences. Kafka drops them and answers with where the first copies are.
    again = BatchCopier(*wires, producer=first.producer)
    again.start(Partition(unique, 0), 0, unique, LIMIT)
    assert segments(copy_all(again, 300), Partition(unique, 0)) == [Segment(0, 0, 300)]
    assert len(consume_all(destination, unique, 1, 300)) == 300  # and no more after a moment's drain

    produce(source, [{"topic": unique, "value": b"%d" % i} for i in range(300, 400)])
    assert segments(copy_all(first, 100), Partition(unique, 0)) == [Segment(300, 300, 100)]


def test_a_fetch_waiting_long_at_its_broker_holds_no_step_and_brings_the_first_record_at_once(
    apache_kafka: StackEndpoints, wires: tuple[KafkaWire, KafkaWire], unique: str
) -> None:
    create_topics(apache_kafka.source_bootstrap_servers, {unique: 1})
    create_topics(apache_kafka.destination_bootstrap_servers, {unique: 1})
    copier = BatchCopier(*wires, max_wait_ms=30_000)
    copier.step_wait_ms = 100
    copier.start(Partition(unique, 0), 0, unique, LIMIT)
    started = time.monotonic()
    assert copier.step() == Step()  # nothing to copy yet: the step ends while its fetch still waits at the broker
    assert copier.waiting_ms() == 30_000
    assert time.monotonic() - started < 10, "a step waited for the broker's 30 s"
    produce(apache_kafka.source_bootstrap_servers, [{"topic": unique, "value": b"v"}])
    # The same fetch is answered at the record, long before its 30 s: a later step copies it.
    assert segments(copy_all(copier, 1, timeout=10), Partition(unique, 0)) == [Segment(0, 0, 1)]


def test_a_fetch_sent_ahead_of_a_failed_produce_is_not_used(
    apache_kafka: StackEndpoints, wires: tuple[KafkaWire, KafkaWire], unique: str
) -> None:
    """The next step's fetch leaves while a step's batches are produced, from where the lanes will stand once they
    are acknowledged. A produce that fails leaves its lane behind that position: the lane reads again from the
    failed batch, and its copy has no gap."""
    source, destination = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    create_topics(source, {unique: 2})
    create_topics(destination, {unique: 1})  # partition 1 is missing: its batches are refused
    for p in range(2):
        records = [{"topic": unique, "partition": p, "value": b"%d-%d" % (p, i)} for i in range(300)]
        produce(source, records, **{"batch.num.messages": 100})
    copier = BatchCopier(*wires, partition_fetch_bytes=2_000)  # a batch (of 100 records) a fetch
    for p in range(2):
        copier.start(Partition(unique, p), 0, unique, LIMIT)

    first = copier.step()
    assert first.segments == {Partition(unique, 0): [Segment(0, 0, 100)]}
    assert first.problems[Partition(unique, 1)].retriable
    # Sent from where partition 1 would stand had its batch been written: used, it would skip offsets 0-99.
    assert copier.ahead is not None and copier.ahead[0][Partition(unique, 1)] == 100
    assert copier.lanes[Partition(unique, 1)].position == 0

    admin = AdminClient({"bootstrap.servers": destination})
    admin.create_partitions([NewPartitions(unique, 2)])[unique].result(timeout=30)
    steps: list[Step] = []

    def copied() -> bool:
        steps.append(copier.step())
        return sum(s.records for s in steps) >= 500

    wait_until(copied, 60, interval=0, what="both partitions copied once the destination has partition 1")
    assert segments(steps, Partition(unique, 1)) == [Segment(0, 0, 300)]
    copies = consume_all(destination, unique, 2, 600)
    assert [r.value for r in copies if r.partition == 1] == [b"1-%d" % i for i in range(300)]
    copier.close()


@pytest.fixture
def tansu(tmp_path: Path) -> Iterator[str]:
    """An embedded broker of this test's own, whichever clusters the suite's `stack` points at."""
    broker = tansu_broker("batches-tansu", port := free_port(), port, tmp_path / "tansu.log")
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop(signal.SIGKILL)  # memory storage: nothing to keep


def test_the_embedded_broker_takes_batches_with_an_initproducerid_producer(tansu: str, unique: str) -> None:
    """Tansu 0.6 hands out a producer id, keeps copied batches as they came (lz4, headers, timestamps), and refuses a
    batch sent again with DUPLICATE_SEQUENCE_NUMBER (Kafka answers success and the first copy's offset): the copier
    counts it as written at an offset it cannot know."""
    copied = f"{unique}-copy"
    create_topics(tansu, {unique: 1, copied: 1})
    produce(
        tansu,
        [
            {"topic": unique, "key": b"k%d" % i, "value": b"%05d" % i * 20, "headers": [("n", b"%d" % i)]}
            for i in range(500)
        ],
        **{"compression.type": "lz4", "batch.num.messages": 100},
    )
    with KafkaWire({"bootstrap.servers": tansu}, fetch_max_bytes=8_000_000) as wire:
        copier = BatchCopier(wire, wire)
        copier.start(Partition(unique, 0), 0, copied, LIMIT)
        assert segments(copy_all(copier, 500), Partition(unique, 0)) == [Segment(0, 0, 500)]
        originals, copies = consume_all(tansu, unique, 1, 500), consume_all(tansu, copied, 1, 500)
        assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in copies] == [
            (r.offset, r.key, r.value, r.headers, r.timestamp) for r in originals
        ]
        kept = raw_batches(wire, copied, 1)[0]
        assert {(b.compression, b.producer_id) for b in kept} == {(LZ4, copier.producer.producer_id)}

        again = BatchCopier(wire, wire, producer=copier.producer)
        again.start(Partition(unique, 0), 0, copied, LIMIT)
        steps = copy_all(again, 500)
        assert {s.destination_offset for step in steps for ss in step.segments.values() for s in ss} == {UNKNOWN_OFFSET}
        assert len(consume_all(tansu, copied, 1, 500)) == 500  # and no more after a moment's drain
