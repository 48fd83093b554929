"""Where a start finds the copies made after the last commit (`replicator/batches/destination_batches.py`), on the
suite's Apache Kafka clusters. The destination partition is written as the two paths write it: batch copies are
source batches rewritten (`rewrite`) for a producer id the walk is told is the platform's, record copies carry their
`mirus.source` header and come from an ordinary idempotent producer."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from mirus_dagster.settings import StackEndpoints
from replicator.batches.copier import Segment
from replicator.batches.destination_batches import Copies, copies_since
from replicator.batches.record_batch import RecordBatch, next_sequence, rewrite, split
from replicator.batches.wire import KafkaWire, Partition
from replicator.topics import provenance
from tests.fixtures.kafka_helpers import create_topics, produce

SOURCE_CLUSTER = "the-source-cluster-id"


class Destination:
    """One destination partition, written by a batch producer of the platform and by the record path."""

    def __init__(self, wire: KafkaWire, bootstrap: str, topic: str) -> None:
        self.wire, self.bootstrap, self.partition = wire, bootstrap, Partition(topic, 0)
        self.identity = wire.init_producer_id()
        self.sequence = 0

    def batch_copy(self, original: RecordBatch) -> int:
        """`original` copied as the copier copies it; where it went."""
        copy = rewrite(original, self.identity.producer_id, self.identity.epoch, self.sequence)
        (produced,) = self.wire.produce({self.partition: [copy]})[self.partition]
        assert produced.problem is None, produced.problem
        self.sequence = next_sequence(self.sequence, original.records_count)
        return produced.base_offset

    def record_copies(self, offsets: range, topic: str, partition: int = 0) -> list[dict[str, object]]:
        """Record-path copies of `topic`[`partition`]'s records at `offsets`."""
        return [
            {
                "topic": self.partition.topic,
                "partition": 0,
                "value": b"v%d" % offset,
                "headers": provenance.copy_headers(None, SOURCE_CLUSTER, topic, partition, offset),
            }
            for offset in offsets
        ]

    def copies_found(self, source: KafkaWire, source_topic: str) -> Copies:
        """What a start finds from source offset 0 and destination offset 0 to the partition's end."""
        end = self.wire.fetch({self.partition: 0}, max_wait_ms=0)[self.partition].high_watermark
        return copies_since(
            source, self.wire, Partition(source_topic, 0), 0, self.partition, 0, end, SOURCE_CLUSTER,
            {self.identity.producer_id},
        )  # fmt: skip


def _topics(
    apache_kafka: StackEndpoints, wires: tuple[KafkaWire, KafkaWire], topic: str
) -> tuple[list[RecordBatch], Destination]:
    """Four batches of ten records at the source, and an empty destination partition."""
    source, bootstrap = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    create_topics(source, {topic: 1})
    create_topics(bootstrap, {topic: 1})
    for first in range(0, 40, 10):
        produce(source, [{"topic": topic, "value": b"v%d" % i} for i in range(first, first + 10)])
    fetched = wires[0].fetch({Partition(topic, 0): 0}, partition_max_bytes=1_000_000)[Partition(topic, 0)]
    batches = split(fetched.records)[0]
    assert [(b.base_offset, b.records_count) for b in batches] == [(0, 10), (10, 10), (20, 10), (30, 10)]
    return batches, Destination(wires[1], bootstrap, topic)


def test_copies_of_both_paths_in_turn_are_found_to_the_last_whatever_lies_between(
    apache_kafka: StackEndpoints, wires: tuple[KafkaWire, KafkaWire], unique: str
) -> None:
    (a, _b, c, d), destination = _topics(apache_kafka, wires, unique)
    source_wire, bootstrap = wires[0], apache_kafka.destination_bootstrap_servers

    assert destination.batch_copy(a) == 0
    # The record path copies the start of b, beside a copy from another source topic the destination partition
    # takes too (topics renamed into one), then a transaction that copied the rest is aborted.
    copies, other = destination.record_copies, f"{unique}-other"
    produce(bootstrap, [*copies(range(10, 13), unique), *copies(range(50, 51), other), *copies(range(13, 15), unique)])
    aborted = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique})
    aborted.init_transactions(30)
    aborted.begin_transaction()
    for record in destination.record_copies(range(15, 40), unique):
        aborted.produce(**record)
    aborted.abort_transaction(30)
    assert destination.copies_found(source_wire, unique) == Copies(15, [Segment(0, 0, 10)]), "mid-batch: b partly"

    # The record path copies the rest of b; then batches again, among them a copy of a batch written before.
    produce(bootstrap, destination.record_copies(range(15, 20), unique))
    at_c = destination.batch_copy(c)
    destination.batch_copy(a)
    at_d = destination.batch_copy(d)
    assert destination.copies_found(source_wire, unique) == Copies(
        40, [Segment(0, 0, 10), Segment(20, at_c, 10), Segment(30, at_d, 10)]
    )


def test_a_batch_copy_of_a_later_batch_than_the_next_is_no_proof_of_the_records_before_it(
    apache_kafka: StackEndpoints, wires: tuple[KafkaWire, KafkaWire], unique: str
) -> None:
    (a, _b, c, _d), destination = _topics(apache_kafka, wires, unique)
    source_wire, bootstrap = wires[0], apache_kafka.destination_bootstrap_servers
    destination.batch_copy(a)
    destination.batch_copy(c)  # b is not at the destination: c's copy cannot mean it is
    produce(bootstrap, destination.record_copies(range(10, 13), f"{unique}-other"))  # another source topic's
    assert destination.copies_found(source_wire, unique) == Copies(10, [Segment(0, 0, 10)])


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4"])
def test_record_path_copies_compressed_by_the_destination_producer_are_found(
    apache_kafka: StackEndpoints, wires: tuple[KafkaWire, KafkaWire], unique: str, codec: str
) -> None:
    # producer.compression.type on a connector compresses the record path's copies: a start reads their headers
    # inside the compressed batch (kafka-python decodes with the lz4 and python-snappy packages).
    (a, _b, _c, _d), destination = _topics(apache_kafka, wires, unique)
    destination.batch_copy(a)
    produce(apache_kafka.destination_bootstrap_servers, destination.record_copies(range(10, 17), unique),
            **{"compression.type": codec})  # fmt: skip
    assert destination.copies_found(wires[0], unique) == Copies(17, [Segment(0, 0, 10)])
