"""Reading assigned partitions to their end, on brokers whose high watermarks cannot be trusted.

Offset translation and exactly-once resume both read destination partitions forward until each reports its end
(`enable.partition.eof`) rather than comparing positions with watermarks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from confluent_kafka import Consumer, KafkaError, Message


class PartitionReadError(RuntimeError):
    """A partition reported an error, or neither delivered records nor reached its end in time."""


def read_to_end(
    consumer: Consumer,
    partitions: set[tuple[str, int]],
    idle_s: float,
    should_stop: Callable[[], bool] = lambda: False,
) -> Iterator[Message]:
    """The records of `partitions` (assigned to `consumer`, which has `enable.partition.eof`) until each ended;
    PartitionReadError if `should_stop` says so first."""
    open_partitions = set(partitions)
    idle_since = time.monotonic()
    while open_partitions:
        if should_stop():
            raise PartitionReadError(f"stopped before {len(open_partitions)} partition(s) were read to their end")
        # consume() returns once it has 1,000 messages or its timeout passed: a short one, or every read of a few
        # records (a task's start looking for its copies) would take a whole second.
        messages = consumer.consume(1000, 0.05)
        if not messages and time.monotonic() - idle_since > idle_s:
            shown = ", ".join(f"{t}[{p}]" for t, p in sorted(open_partitions))
            raise PartitionReadError(f"no end reached within {idle_s:.0f}s for {shown}")
        for msg in messages:
            idle_since = time.monotonic()
            err = msg.error()
            if err is None:
                yield msg
            elif err.code() == KafkaError._PARTITION_EOF:
                open_partitions.discard((msg.topic(), msg.partition()))
            else:
                raise PartitionReadError(f"{msg.topic()}[{msg.partition()}]: {err.str()}")
