"""Where each source partition's copies end at the destination, read from the destination itself.

Every copy carries its source partition and offset (`mirus.source`, `replicator.topics.provenance`), and every
commit stores, beside each partition's next source offset, the destination offset its next copy goes to. So a task
that starts can read each destination partition forward from that stored offset and find the last copy of every
source partition it resumes: what a crash left at the destination after the last commit.

- Exactly-once (`replicator.engine.transactions`) resumes after that copy: a crash between a transaction's commit
  and the offsets' commit leaves the destination ahead of Postgres.
- At least once, those copies are what the task re-sends when it resumes from its committed offsets
  (`mirus_records_resent_total`); with `start.after.destination.copies=true` it starts after them instead and
  re-sends nothing. That is sound because an at-least-once producer is idempotent with gapless ordering: a copy
  at the destination means every earlier record of its source partition is there too (a refused record stops the
  producer before any later one of its partition is written, and a new producer starts again from the first
  unacknowledged record).

With copy.mode=batches, whose copies carry no header, a start reads both paths' copies with
`replicator.batches.destination_batches` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from replicator.assignment import SourcePartition
from replicator.partition_reader import PartitionReadError, read_to_end
from replicator.topics import provenance

# A destination partition that neither delivers records nor reports its end for this long: longer than the
# default transaction.timeout.ms (60 s), after which the broker aborts a transaction its dead producer left open.
SCAN_IDLE_S = 90.0


class DestinationReadError(RuntimeError):
    """The destination could not be read to find where copies end."""


@dataclass(frozen=True)
class SearchPoint:
    """Where the destination's copies of one source partition are read from."""

    topic: str  # destination topic and partition
    partition: int
    start: int | None  # destination offset to read from (stored with the Postgres offsets), None: the beginning


def copies_end(
    settings: Mapping[str, Any],
    source_cluster: str,
    points: Mapping[SourcePartition, SearchPoint],
    idle_s: float = SCAN_IDLE_S,
    should_stop: Callable[[], bool] = lambda: False,
) -> dict[SourcePartition, int]:
    """Per source partition, the next source offset after its last copy at the destination (absent when the
    destination holds none past the point). Reads each destination partition once (`read_committed`: an aborted
    transaction's copies do not count), from its point to its end. DestinationReadError if `should_stop` first."""
    found: dict[SourcePartition, int] = {}
    if not points:
        return found
    wanted: dict[tuple[str, int], dict[bytes, SourcePartition]] = {}
    for tp, point in points.items():
        prefix = provenance.source_prefix(source_cluster, *tp)
        wanted.setdefault((point.topic, point.partition), {})[prefix] = tp
    consumer = Consumer(
        {
            **settings,
            "group.id": "mirus-resume",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            # A partition's end is known from the fetch that finds nothing more: the broker holds such a fetch for
            # fetch.wait.max.ms (500 ms by default), which every start would wait out.
            "fetch.wait.max.ms": 10,
        }
    )
    try:
        starts: dict[tuple[str, int], int | None] = {}
        for point in points.values():  # a destination partition several source partitions share: the earliest point
            key = (point.topic, point.partition)
            if key not in starts:
                starts[key] = point.start
            elif (earlier := starts[key]) is not None:
                starts[key] = None if point.start is None else min(earlier, point.start)
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING if s is None else s) for (t, p), s in starts.items()])
        for msg in read_to_end(consumer, set(starts), idle_s, should_stop):
            for name, value in msg.headers() or ():
                if name == provenance.SOURCE and value is not None:
                    prefix, _, offset = value.rpartition(b"/")
                    copied = wanted[(msg.topic(), msg.partition())].get(prefix + b"/")
                    if copied is not None:
                        found[copied] = max(found.get(copied, 0), int(offset) + 1)
    except PartitionReadError as exc:
        raise DestinationReadError(f"reading the destination to resume: {exc}") from None
    finally:
        consumer.close()
    return found
