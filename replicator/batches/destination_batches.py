"""The batches a batch path wrote to the destination after its last commit, found again by their bytes.

A copy made as bytes carries no provenance header, so a start finds it otherwise: from the offsets stored with the
last commit (the source offset, and the destination offset its next copy went to), the destination partition is
read batch by batch beside the source partition. A destination batch is a copy of the next source batch the copier
would have copied (control batches, aborted transactions and the platform's own copies skipped, as it skips them)
when this platform's batch producer wrote it and its records are the source batch's, byte for byte: only a batch's
header is rewritten on the way. The first batch that is not stops the walk; what lies past it is not known to be a
copy, and a start that resumes before it re-sends rather than skips.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from replicator.batches.copier import Segment, merged
from replicator.batches.record_batch import HEADER_SIZE, RecordBatch, committed, split, truncated_length
from replicator.batches.wire import KafkaWire, Partition, Problem

READ_BYTES = 1_048_576


class BatchReadError(RuntimeError):
    """A partition could not be read while looking for copies."""

    def __init__(self, partition: Partition, problem: Problem) -> None:
        super().__init__(f"{partition.topic}[{partition.partition}]: {problem.name} (error {problem.code})")


def copies_since(
    source: KafkaWire,
    destination: KafkaWire,
    source_partition: Partition,
    source_offset: int,
    destination_partition: Partition,
    destination_offset: int,
    destination_end: int,
    producers: set[int],
    ours: Callable[[int], bool] = lambda _producer_id: False,
) -> list[Segment]:
    """The copies of `source_partition`'s batches from `source_offset` on that the destination holds from
    `destination_offset` up to `destination_end`, written by one of `producers` (this platform's batch producers at
    the destination), as segments in order; empty when the first batch there is not such a copy."""
    originals = _batches(source, source_partition, source_offset, None)
    found = []
    position = source_offset
    for copy in _batches(destination, destination_partition, destination_offset, destination_end):
        if copy.base_offset < destination_offset:
            continue  # the batch the stored offset falls inside: written before the last commit
        if copy.producer_id not in producers:
            break
        original = next((b for b in originals if not (b.producer_id >= 0 and ours(b.producer_id))), None)
        if original is None or original.base_offset < position or not _same_records(original, copy):
            break
        found.append(Segment(original.base_offset, copy.base_offset, original.records_count))
        position = original.next_offset
    return merged(found)


def _same_records(original: RecordBatch, copy: RecordBatch) -> bool:
    return (
        original.magic == copy.magic == 2
        and original.records_count == copy.records_count
        and original.last_offset_delta == copy.last_offset_delta
        and original.data[HEADER_SIZE:] == copy.data[HEADER_SIZE:]
    )


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
