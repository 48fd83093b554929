"""Record batches as bytes: split a fetched blob, judge whether a batch can pass, drop what read_committed drops,
and rewrite a batch's header for this platform's producer. Records are never decoded (a control batch's marker is
read through kafka-python's record reader: one small batch per transaction).

A v2 batch (magic 2) starts with a 61-byte header, big-endian:

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 | crc uint32 | attributes int16 |
    lastOffsetDelta int32 | baseTimestamp int64 | maxTimestamp int64 | producerId int64 | producerEpoch int16 |
    baseSequence int32 | recordsCount int32

`batchLength` counts the bytes after itself; the CRC-32C covers attributes to the end. Older message sets (magic 0
and 1) keep the offset, the length and the magic byte at the same places, so a blob is split the same way whatever
it holds.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import crc32c

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset and batchLength: what batchLength does not count
MAGIC_AT = 16
CRC_AT = 17
ATTRIBUTES_AT = 21
PRODUCER_AT = 43  # producerId, producerEpoch, baseSequence
COMPRESSION_MASK = 0x07
TRANSACTIONAL = 0x10
CONTROL = 0x20
LOG_APPEND_TIME = 0x08
NO_PRODUCER_ID = -1
NO_LEADER_EPOCH = -1
MAX_SEQUENCE = 2**31  # sequences wrap to 0 past Int32's maximum, as the Java producer's do


class CorruptBatchError(ValueError):
    """A fetched blob whose batch lengths make no sense."""


class Reason(enum.Enum):
    """Why a batch cannot be copied as bytes; the record path copies it."""

    MAGIC = "not a v2 record batch (magic 0 or 1)"
    GAPS = "its inner offsets have gaps (a compacted batch): brokers refuse non-sequential offsets"
    TOO_LARGE = "larger than the destination topic's max.message.bytes"
    PARTIAL = "it starts before the position: copying it whole would copy records twice"
    APPEND_TIME = (
        "its topic keeps append times (LogAppendTime): copied as bytes, its records would show their producer's "
        "timestamps at the destination instead of the append time a source consumer reads"
    )


class RecordBatch(NamedTuple):
    """One batch of a fetched blob: its bytes (a view, not a copy) and its header. For magic 0 and 1 only
    `base_offset`, `batch_length` and `magic` are read (the other fields are -1)."""

    data: memoryview
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        """0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd."""
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp(self) -> int:
        """The batch's timestamp for latency: the broker's append time (LogAppendTime, which every record of it
        takes), else its first record's CreateTime (most often its oldest)."""
        return self.max_timestamp if self.attributes & LOG_APPEND_TIME else self.base_timestamp

    @property
    def is_control(self) -> bool:
        return self.magic == 2 and bool(self.attributes & CONTROL)

    @property
    def is_transactional(self) -> bool:
        return self.magic == 2 and bool(self.attributes & TRANSACTIONAL)

    def why_not(self, position: int, max_message_bytes: int) -> Reason | None:
        """Why this batch cannot pass to a topic of `max_message_bytes` when the copy stands at source offset
        `position`; None when it can. (The partition kept and no per-record change are the connector's to say.)"""
        if self.magic != 2:
            return Reason.MAGIC
        if self.attributes & LOG_APPEND_TIME:
            # A consumer reads each record of such a batch at the batch's max timestamp (the append time); the
            # records' own fields keep their producer's timestamps, which a CreateTime destination topic shows.
            return Reason.APPEND_TIME
        if self.base_offset < position:
            return Reason.PARTIAL
        if self.records_count != self.last_offset_delta + 1:
            return Reason.GAPS
        if self.size > max_message_bytes:
            return Reason.TOO_LARGE
        return None

    def is_abort_marker(self) -> bool:
        """A control batch whose marker is ABORT (COMMIT otherwise), read with kafka-python's record reader."""
        # Imported here: `Reason` is read by processes that never copy batches (the API, the assets, a task on the
        # record path), and kafka-python is a tenth of a second of their start.
        from kafka.record.default_records import DefaultRecordBatch

        return self.is_control and any(record.abort for record in DefaultRecordBatch(self.data))


def split(blob: bytes | memoryview) -> tuple[list[RecordBatch], int]:
    """The complete batches of a fetched records blob, and how many bytes of it they span. A truncated batch at
    the end (the broker cuts a response at its byte limit) is left for the next fetch, which starts at its offset."""
    view = memoryview(blob)
    batches: list[RecordBatch] = []
    at = 0
    while len(view) - at >= LOG_OVERHEAD:
        base_offset, batch_length = struct.unpack_from(">qi", view, at)
        if batch_length <= MAGIC_AT - LOG_OVERHEAD:
            raise CorruptBatchError(f"a batch at offset {base_offset} claims {batch_length} bytes")
        end = at + LOG_OVERHEAD + batch_length
        if end > len(view):
            break
        data = view[at:end]
        if data[MAGIC_AT] == 2 and len(data) >= HEADER_SIZE:
            batches.append(RecordBatch(data, *HEADER.unpack_from(data)))
        else:
            batches.append(RecordBatch(data, base_offset, batch_length, -1, data[MAGIC_AT], *(-1,) * 9))
        at = end
    return batches, at


def truncated_length(blob: bytes | memoryview, at: int) -> int | None:
    """The whole size of the truncated batch starting at byte `at` of `blob`, if its length is there to read."""
    if len(blob) - at < LOG_OVERHEAD:
        return None
    return int(LOG_OVERHEAD + struct.unpack_from(">i", blob, at + 8)[0])


@dataclass(frozen=True, slots=True)
class AbortedTransaction:
    """One entry of a read_committed fetch response's aborted transactions of a partition."""

    producer_id: int
    first_offset: int


def committed(batches: Iterable[RecordBatch], aborted: Sequence[AbortedTransaction]) -> Iterator[RecordBatch]:
    """The data batches a read_committed consumer reads: control batches and aborted transactions' batches dropped.

    The consumer's algorithm (Kafka's `Fetcher`): walking the batches in order, a producer id joins the aborted set
    when an aborted transaction of it begins at or before a batch's last offset; its transactional batches are
    dropped until its ABORT marker, which takes it out again."""
    pending = sorted(aborted, key=lambda a: a.first_offset)
    aborting: set[int] = set()
    for batch in batches:
        if batch.magic == 2 and batch.producer_id != NO_PRODUCER_ID:
            last_offset = batch.next_offset - 1
            while pending and pending[0].first_offset <= last_offset:
                aborting.add(pending.pop(0).producer_id)
            if batch.is_control and batch.producer_id in aborting and batch.is_abort_marker():
                aborting.discard(batch.producer_id)
            elif batch.is_transactional and batch.producer_id in aborting:
                continue
        if not batch.is_control:
            yield batch


def rewrite(batch: RecordBatch, producer_id: int, producer_epoch: int, base_sequence: int) -> bytearray:
    """A copy of `batch` to produce: this platform's producer id, epoch and base sequence, the transactional bit
    cleared, base offset 0 and no leader epoch (the broker assigns both), the CRC-32C computed again. One copy of
    the bytes and one checksum pass; the records are untouched."""
    out = bytearray(batch.data)
    struct.pack_into(">qi", out, 0, 0, batch.batch_length)
    struct.pack_into(">i", out, 12, NO_LEADER_EPOCH)
    struct.pack_into(">h", out, ATTRIBUTES_AT, batch.attributes & ~TRANSACTIONAL)
    struct.pack_into(">qhi", out, PRODUCER_AT, producer_id, producer_epoch, base_sequence)
    struct.pack_into(">I", out, CRC_AT, crc32c.crc32c(memoryview(out)[ATTRIBUTES_AT:]))
    return out


def next_sequence(sequence: int, records: int) -> int:
    return (sequence + records) % MAX_SEQUENCE
