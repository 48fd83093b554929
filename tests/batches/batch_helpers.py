"""Record batches built by hand for the codec's tests (kafka-python's batch builder), and what tests read back."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import crc32c
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from replicator.batches.record_batch import ATTRIBUTES_AT, CONTROL, CRC_AT

TIMESTAMP = 1_700_000_000_000
GZIP = 1


def batch(
    base_offset: int,
    values: Sequence[bytes | None],
    *,
    offsets: Sequence[int] | None = None,
    producer_id: int = -1,
    transactional: bool = False,
    compression: int = 0,
) -> bytearray:
    """A v2 batch of `values` (keys k0, k1, …, a header each) at `base_offset`; `offsets`: inner offset deltas."""
    epoch, sequence = (0, 0) if producer_id >= 0 else (-1, -1)
    builder = DefaultRecordBatchBuilder(2, compression, transactional, producer_id, epoch, sequence, 1 << 20)
    for i, value in enumerate(values):
        delta = offsets[i] if offsets is not None else i
        builder.append(delta, TIMESTAMP + i, b"k%d" % i, value, [("h", b"%d" % i), ("h", None)])
    data = builder.build()
    struct.pack_into(">q", data, 0, base_offset)
    return data


def marker(base_offset: int, producer_id: int, *, abort: bool) -> bytearray:
    """A transaction's control batch, as the broker writes it: one record whose key says ABORT (0) or COMMIT (1)."""
    builder = DefaultRecordBatchBuilder(2, 0, True, producer_id, 0, -1, 1 << 20)
    builder.append(0, TIMESTAMP, struct.pack(">hh", 0, 0 if abort else 1), struct.pack(">hi", 0, 0), [])
    data = builder.build()
    struct.pack_into(">q", data, 0, base_offset)
    attributes = struct.unpack_from(">h", data, ATTRIBUTES_AT)[0] | CONTROL
    struct.pack_into(">h", data, ATTRIBUTES_AT, attributes)
    struct.pack_into(">I", data, CRC_AT, crc32c.crc32c(memoryview(data)[ATTRIBUTES_AT:]))
    return data


def records(data: bytes | bytearray | memoryview) -> list[tuple[int, int, bytes | None, bytes | None, list]]:
    """Offset, timestamp, key, value and headers of each record of an uncompressed or gzip batch."""
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in DefaultRecordBatch(bytes(data))]


def crc_is_valid(data: bytes | bytearray | memoryview) -> bool:
    return bool(DefaultRecordBatch(bytes(data)).validate_crc())
