"""The batch codec (`replicator/batches/record_batch.py`): batches built by hand for each rule, then batches fetched
from Apache Kafka 1.0 (`apache_kafka`), whose header fields and records kafka-python's own reader agrees with."""

from __future__ import annotations

import struct

import pytest
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from mirus_dagster.settings import StackEndpoints
from replicator.batches.record_batch import (
    HEADER_SIZE,
    MAX_SEQUENCE,
    AbortedTransaction,
    CorruptBatchError,
    Reason,
    committed,
    next_sequence,
    rewrite,
    split,
    truncated_length,
)
from replicator.batches.wire import KafkaWire, Partition
from tests.fixtures.batch_helpers import GZIP, batch, crc_is_valid, marker, records
from tests.fixtures.kafka_helpers import create_topics, produce


def test_a_blob_splits_into_its_batches_and_a_truncated_one_is_left_for_the_next_fetch() -> None:
    first, second, third = batch(0, [b"a", b"b"]), batch(2, [b"c" * 200], compression=GZIP), batch(3, [b"d" * 100])
    blob = bytes(first + second + third)
    batches, used = split(blob[:-10])
    assert [(b.base_offset, b.records_count, b.next_offset, b.compression) for b in batches] == [
        (0, 2, 2, 0),
        (2, 1, 3, GZIP),
    ]
    assert used == len(first) + len(second)
    assert truncated_length(blob[:-10], used) == len(third)
    assert bytes(batches[1].data) == bytes(second)  # a view of the blob, as it came
    whole, used = split(blob)
    assert (len(whole), used) == (3, len(blob))
    assert split(blob[:5]) == ([], 0)  # not even a batch's length


def test_the_header_fields_are_those_kafka_pythons_reader_sees() -> None:
    data = batch(40, [b"x", b"y", b"z"], producer_id=7, transactional=True)
    (read,), _ = split(data)
    reference = DefaultRecordBatch(bytes(data))
    assert (read.base_offset, read.magic, read.crc, read.attributes, read.last_offset_delta) == (
        reference.base_offset,
        reference.magic,
        reference.crc,
        reference.attributes,
        reference.last_offset_delta,
    )
    assert (read.base_timestamp, read.max_timestamp, read.producer_id, read.producer_epoch) == (
        reference.first_timestamp,
        reference.max_timestamp,
        reference.producer_id,
        reference.producer_epoch,
    )
    assert (read.base_sequence, read.records_count, read.size) == (reference.base_sequence, 3, len(data))
    assert read.is_transactional and not read.is_control and not read.is_abort_marker()
    assert marker(50, 7, abort=True)[HEADER_SIZE:] != marker(50, 7, abort=False)[HEADER_SIZE:]
    (abort,), _ = split(marker(50, 7, abort=True))
    (commit,), _ = split(marker(51, 7, abort=False))
    assert abort.is_control and abort.is_abort_marker() and commit.is_control and not commit.is_abort_marker()


def test_a_length_that_makes_no_sense_is_refused() -> None:
    data = batch(0, [b"a"])
    struct.pack_into(">i", data, 8, 2)
    with pytest.raises(CorruptBatchError):
        split(data)


def test_why_a_batch_cannot_pass() -> None:
    legacy = LegacyRecordBatchBuilder(1, 0, 1 << 20)
    legacy.append(0, 1_700_000_000_000, b"k", b"v")
    (old,), _ = split(bytes(legacy.build()))
    (gapped,), _ = split(batch(10, [b"a", b"b"], offsets=[0, 2]))
    (whole,), _ = split(batch(10, [b"a", b"b", b"c"]))
    assert old.magic == 1 and old.why_not(0, 1_000_000) is Reason.MAGIC
    assert gapped.why_not(10, 1_000_000) is Reason.GAPS
    assert whole.why_not(11, 1_000_000) is Reason.PARTIAL  # the position fell inside it
    assert whole.why_not(10, whole.size - 1) is Reason.TOO_LARGE  # the whole batch counts, as the broker counts it
    assert whole.why_not(10, whole.size) is None
    assert whole.why_not(5, whole.size) is None  # offsets before it were dropped (a marker, an aborted batch)


def test_a_rewritten_batch_keeps_its_records_and_carries_the_platforms_producer() -> None:
    source = batch(1234, [b"one" * 50, b"two" * 50, None], producer_id=99, transactional=True, compression=GZIP)
    (read,), _ = split(source)
    out = rewrite(read, producer_id=5, producer_epoch=3, base_sequence=700)
    (copy,), _ = split(out)
    assert (copy.producer_id, copy.producer_epoch, copy.base_sequence) == (5, 3, 700)
    assert not copy.is_transactional and copy.compression == GZIP
    assert (copy.base_offset, copy.partition_leader_epoch) == (0, -1)  # the broker's to assign
    assert (copy.base_timestamp, copy.max_timestamp, copy.records_count, copy.last_offset_delta) == (
        read.base_timestamp,
        read.max_timestamp,
        3,
        2,
    )
    assert bytes(out[HEADER_SIZE:]) == bytes(source[HEADER_SIZE:])  # the records' bytes, untouched
    assert crc_is_valid(out) and copy.crc != read.crc
    assert [r[1:] for r in records(out)] == [r[1:] for r in records(source)]
    assert next_sequence(MAX_SEQUENCE - 2, 5) == 3  # sequences wrap as the Java producer's do


def test_read_committed_drops_markers_and_aborted_transactions_only() -> None:
    # Producer 7's transaction at 1-2 is aborted (marker at 4); producer 8's at 3 commits (marker at 5); producer 7
    # begins again at 6 and commits (7). Offset 0 is an idempotent producer's batch, 8 one with no producer at all.
    blob = b"".join(
        bytes(b)
        for b in (
            batch(0, [b"idempotent"], producer_id=7),
            batch(1, [b"aborted", b"aborted"], producer_id=7, transactional=True),
            batch(3, [b"committed"], producer_id=8, transactional=True),
            marker(4, 7, abort=True),
            marker(5, 8, abort=False),
            batch(6, [b"committed again"], producer_id=7, transactional=True),
            marker(7, 7, abort=False),
            batch(8, [b"plain"]),
        )
    )
    batches, _ = split(blob)
    kept = committed(batches, [AbortedTransaction(producer_id=7, first_offset=1)])
    assert [b.base_offset for b in kept] == [0, 3, 6, 8]
    assert [b.base_offset for b in committed(batches, [])] == [0, 1, 3, 6, 8]  # read_uncommitted: markers only


def test_batches_fetched_from_kafka_read_as_kafka_pythons_reader_reads_them(
    apache_kafka: StackEndpoints, unique: str
) -> None:
    bootstrap = apache_kafka.source_bootstrap_servers
    create_topics(bootstrap, {unique: 1})
    produce(
        bootstrap,
        [{"topic": unique, "key": b"k%d" % i, "value": b"v%d" % i, "headers": [("n", b"%d" % i)]} for i in range(300)],
        **{"compression.type": "gzip", "batch.num.messages": 100},
    )
    with KafkaWire({"bootstrap.servers": bootstrap}, fetch_max_bytes=1_000_000) as wire:
        fetched = wire.fetch({Partition(unique, 0): 0})[Partition(unique, 0)]
    assert fetched.problem is None and fetched.high_watermark == 300
    batches, used = split(fetched.records)
    assert used == len(fetched.records) and sum(b.records_count for b in batches) == 300
    assert [b.base_offset for b in batches] == [0, 100, 200]
    for read in batches:
        reference = DefaultRecordBatch(bytes(read.data))
        assert reference.validate_crc() and read.crc == reference.crc
        assert (read.producer_id, read.base_sequence, read.compression) == (
            reference.producer_id,
            read.base_offset,
            GZIP,
        )
        assert read.why_not(read.base_offset, 1_000_012) is None
        out = rewrite(read, producer_id=1, producer_epoch=0, base_sequence=0)
        assert crc_is_valid(out)
        assert [r[1:] for r in records(out)] == [r[1:] for r in records(read.data)]
        assert [r[2] for r in records(out)] == [b"k%d" % i for i in range(read.base_offset, read.next_offset)]
