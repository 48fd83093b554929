"""Where the copies a task made after its last commit end at the destination, whichever path made them.

A start (copy.mode=batches) reads the destination partition batch by batch from the destination offset stored with
the last commit, beside the source partition from its committed offset, and keeps a position: the source offset
before which every record is known to be at the destination. Two kinds of copies move it on, in any order and any
number of times, because each one means every earlier record of its source partition is at the destination:

- A record-path copy names its source partition and offset (`mirus.source`, read from the batch's records): its
  producer is idempotent and gapless, and a partition is given to the record path only where every earlier record is
  at the destination. A copy of offset O moves the position to O + 1 at least, also in the middle of a source batch.
- A batch-path copy carries no header. A destination batch is the copy of the next source batch from the position
  (control batches, aborted transactions and the platform's own copies skipped, as the copier skips them; never one
  starting before the position, which the copier hands to the record path) when this platform's batch producer
  wrote it and it is that batch byte for byte but for what the copier rewrites (offset, leader epoch, producer, the
  transactional bit, CRC). The copier starts a batch only once everything before it is acknowledged. Its segment is
  the copy's provenance, stored by the start.

Anything else is passed over: batches of other writers, copies of other source partitions (a destination partition
several feed), a batch whose records cannot be read here (a codec kafka-python lacks). Passing over never moves the
position, so at worst a start resumes before a copy and writes it again; it never skips a record not there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kafka.errors import UnsupportedCodecError
from kafka.record.default_records import DefaultRecordBatch

from replicator.batches.copier import Segment, merged
from replicator.batches.record_batch import (
    HEADER_SIZE,
    TRANSACTIONAL,
    RecordBatch,
    committed,
    split,
    truncated_length,
)
from replicator.batches.wire import KafkaWire, Partition, Problem
from replicator.topics import provenance

READ_BYTES = 1_048_576


class BatchReadError(RuntimeError):
    """A partition could not be read while looking for copies."""

    def __init__(self, partition: Partition, problem: Problem) -> None:
        super().__init__(f"{partition.topic}[{partition.partition}]: {problem.name} (error {problem.code})")


@dataclass(frozen=True)
class Copies:
    """What a walk found: the source offset after the last copy (the committed offset when none), and the batch
    copies among them as segments, in order."""

    end: int
    segments: list[Segment]


def copies_since(
    source: KafkaWire,
    destination: KafkaWire,
    source_partition: Partition,
    source_offset: int,
    destination_partition: Partition,
    destination_offset: int,
    destination_end: int,
    source_cluster: str,
    producers: set[int],
    ours: Callable[[int], bool] = lambda _producer_id: False,
) -> Copies:
    """The copies of `source_partition` from `source_offset` on that the destination holds from `destination_offset`
    up to `destination_end`: record-path copies by their `mirus.source` values (`source_cluster`'s), batch copies
    written by one of `producers` (this platform's batch producers at the destination) by their bytes."""
    prefix = provenance.source_prefix(source_cluster, *source_partition)
    originals = (
        b
        for b in _batches(source, source_partition, source_offset, None)
        if not (b.producer_id >= 0 and ours(b.producer_id))
    )
    original: RecordBatch | None = None  # the source batch a batch copy must be of, read when one comes
    position, found = source_offset, []
    for copy in _batches(destination, destination_partition, destination_offset, destination_end):
        if copy.producer_id in producers:
            while original is None or original.base_offset < position:  # before: copied (by the record path)
                if (original := next(originals, None)) is None:
                    break
            if original is not None and _copied(original, copy):
                found.append(Segment(original.base_offset, copy.base_offset, original.records_count))
                position = original.next_offset
        elif copy.magic == 2:
            position = max(position, _record_copies_end(copy, prefix))
    return Copies(position, merged(found))


def _copied(original: RecordBatch, copy: RecordBatch) -> bool:
    return (
        original.magic == copy.magic == 2
        and original.attributes & ~TRANSACTIONAL == copy.attributes
        and original.base_timestamp == copy.base_timestamp
        and original.max_timestamp == copy.max_timestamp
        and original.records_count == copy.records_count
        and original.last_offset_delta == copy.last_offset_delta
        and original.data[HEADER_SIZE:] == copy.data[HEADER_SIZE:]
    )


def _record_copies_end(batch: RecordBatch, prefix: bytes) -> int:
    """The source offset after the last record-path copy of `prefix`'s partition in `batch` (0 when none)."""
    end = 0
    try:
        for record in DefaultRecordBatch(bytes(batch.data)):
            for name, value in record.headers:
                if name == provenance.SOURCE and value is not None and value.startswith(prefix):
                    end = max(end, int(value[len(prefix) :]) + 1)
    except UnsupportedCodecError:
        return 0
    return end


def _batches(wire: KafkaWire, partition: Partition, offset: int, end: int | None) -> Iterator[RecordBatch]:
    """The data batches of `partition` from `offset` on (read_committed), until `end` or the log's end."""
    size = READ_BYTES
    while end is None or offset < end:
        fetched = wire.fetch({partition: offset}, partition_max_bytes=size, max_wait_ms=0)[partition]
        if fetched.problem is not None:
            raise BatchReadError(partition, fetched.problem)
        batches, complete = split(fetched.records)
        if not batches:
            if not fetched.records:
                return  # the log's end (or its last stable offset)
            size = max(size, truncated_length(fetched.records, complete) or 0)  # one batch larger than asked
            continue
        yield from committed(batches, fetched.aborted)
        offset = batches[-1].next_offset
