"""Reading assigned partitions to their end, on brokers whose high watermarks cannot be trusted.

Offset translation and exactly-once resume both read destination partitions forward until each reports its end
(`enable.partition.eof`) rather than comparing positions with watermarks. `Record` is how the platform's code reads
a consumed record, here and wherever it consumes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Protocol, cast

from confluent_kafka import Consumer, KafkaError, Message


class Record(Protocol):
    """A consumed record: confluent-kafka's `Message` whose `error()` is None, typed as such.

    confluent-kafka types `Message` for error events and produced messages too: `topic()`, `partition()` and
    `offset()` Optional, `headers()` as anything `produce` accepts. A consumed record always has all three, and its
    headers are a list of (name, value) pairs. A consumer's batch holds error events among its records; code that
    types a whole batch as records (one cast, no per-record cost: the task's forwarding loop) checks `error()`
    before it reads anything else of a message, and hands an error event on as the `Message` it is.
    """

    def error(self) -> KafkaError | None: ...
    def topic(self) -> str: ...
    def partition(self) -> int: ...
    def offset(self) -> int: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> list[tuple[str, bytes | None]] | None: ...
    def timestamp(self) -> tuple[int, int]: ...


def as_records(messages: list[Message]) -> list[Record]:
    """A consumer's batch typed as records (the same list): see `Record` for the error events it may still hold."""
    return cast("list[Record]", messages)


class PartitionReadError(RuntimeError):
    """A partition reported an error, or neither delivered records nor reached its end in time."""


def read_to_end(
    consumer: Consumer,
    partitions: set[tuple[str, int]],
    idle_s: float,
    should_stop: Callable[[], bool] = lambda: False,
) -> Iterator[Record]:
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
                yield cast(Record, msg)
            elif err.code() == KafkaError._PARTITION_EOF:
                open_partitions.discard((msg.topic(), msg.partition()))
            else:
                raise PartitionReadError(f"{msg.topic()}[{msg.partition()}]: {err.str()}")
