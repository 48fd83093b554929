"""Exactly-once mode (`exactly.once.support=required`): a task's destination transactions and where it resumes.

A task writes through one transactional producer, `transactional.id` = `mirus-<connector>-<task>`: its
`init_transactions` fences every earlier instance of the same task (their open transaction is aborted, their
later writes refused). Every `offset.flush.interval.ms` the task lets its in-flight records be acknowledged,
commits the transaction and only then stores the partitions' next source offsets in Postgres (epoch-fenced), with
each destination partition's offset after the transaction's last record. A crash between the two leaves the
destination ahead of Postgres; `resume_offsets` closes that gap by reading each destination partition
(`read_committed`) forward from the stored destination offset and finding the last copy of the source partition
by its `mirus.source` header. An aborted transaction's records are never seen by `read_committed` readers, so
the task rewinds every partition to its last committed record and writes them again.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from replicator.assignment import SourcePartition
from replicator.partition_reader import PartitionReadError, read_to_end
from replicator.state.store import FencedError
from replicator.topics import provenance

# A newer producer with the same transactional.id exists: this instance must stop (as a fenced Postgres write).
FENCED_CODES = {KafkaError.PRODUCER_FENCED, KafkaError._FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
# A destination partition that neither delivers records nor reports its end for this long: longer than the
# default transaction.timeout.ms (60 s), after which the broker aborts a transaction its dead producer left open.
SCAN_IDLE_S = 90.0


class TransactionError(RuntimeError):
    """The destination cannot run this task's transactions (unsupported, not authorized, a fatal error)."""


class TransactionAborted(Exception):
    """The current transaction must be aborted (librdkafka's `txn_requires_abort`)."""


class CommitResult(enum.Enum):
    COMMITTED = "committed"
    RETRY = "retry"  # not finished within the time given (coordinator busy or unreachable): call again


def _error(exc: KafkaException) -> KafkaError:
    err = exc.args[0]
    return err if isinstance(err, KafkaError) else KafkaError(KafkaError._FAIL, str(exc))


def _raise_fatal(err: KafkaError, what: str) -> None:
    if err.code() in FENCED_CODES:
        raise FencedError(f"{what}: fenced by a newer producer with the same transactional.id ({err.name()})")
    raise TransactionError(f"{what}: the destination refused ({err.name()}: {err.str()})")


class Transactions:
    """The transactional producer's life cycle, with librdkafka's error classes mapped to what the task does."""

    def __init__(self, producer: Producer, what: str) -> None:
        self.producer = producer
        self.what = what  # names the task in messages
        self.open = False

    def start(self, timeout_s: float) -> None:
        """Fence earlier instances of this transactional.id and open the first transaction."""
        try:
            self.producer.init_transactions(timeout_s)
        except KafkaException as exc:
            err = _error(exc)
            if err.code() in FENCED_CODES:
                _raise_fatal(err, self.what)
            raise TransactionError(
                f"{self.what}: the destination cannot run transactions, which exactly.once.support needs "
                f"({err.name()}: {err.str()})"
            ) from None
        self.begin()

    def begin(self) -> None:
        try:
            self.producer.begin_transaction()
        except KafkaException as exc:
            _raise_fatal(_error(exc), self.what)
        self.open = True

    def commit(self, timeout_s: float) -> CommitResult:
        """Commit the open transaction (all its records must be acknowledged already)."""
        try:
            self.producer.commit_transaction(timeout_s)
        except KafkaException as exc:
            err = _error(exc)
            if err.txn_requires_abort():
                raise TransactionAborted(f"{err.name()}: {err.str()}") from None
            if err.retriable():
                return CommitResult.RETRY
            _raise_fatal(err, self.what)
        self.open = False
        return CommitResult.COMMITTED

    def abort(self, timeout_s: float) -> None:
        """Abort the open transaction; its records stay invisible to read_committed readers."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.producer.abort_transaction(max(deadline - time.monotonic(), 0.1))
                self.open = False
                return
            except KafkaException as exc:
                err = _error(exc)
                if not err.retriable() or time.monotonic() >= deadline:
                    _raise_fatal(err, self.what)


def fence(settings: Mapping[str, Any], timeout_s: float) -> None:
    """Fence the task whose producer `settings` are: its open transaction is aborted, its later writes refused."""
    try:
        Producer(settings).init_transactions(timeout_s)
    except KafkaException as exc:
        err = _error(exc)
        raise TransactionError(f"fencing {settings['transactional.id']} failed ({err.name()}: {err.str()})") from None


@dataclass(frozen=True)
class ResumePoint:
    """Where the destination's copies of one source partition end."""

    topic: str  # destination topic and partition
    partition: int
    start: int | None  # destination offset to read from (stored with the Postgres offsets), None: the beginning


def resume_offsets(
    settings: Mapping[str, Any], source_cluster: str, points: Mapping[SourcePartition, ResumePoint]
) -> dict[SourcePartition, int]:
    """Per source partition, the next source offset after its last committed copy at the destination (absent
    when the destination holds none). Reads each destination partition once, from its stored position to its end."""
    found: dict[SourcePartition, int] = {}
    if not points:
        return found
    wanted: dict[tuple[str, int], dict[bytes, SourcePartition]] = {}
    for tp, point in points.items():
        prefix = provenance.source_prefix(source_cluster, *tp)
        wanted.setdefault((point.topic, point.partition), {})[prefix] = tp
    consumer = Consumer({
        **settings, "group.id": "mirus-resume", "isolation.level": "read_committed", "enable.auto.commit": False,
        "enable.partition.eof": True, "auto.offset.reset": "earliest",
    })  # fmt: skip
    try:
        starts = {(p.topic, p.partition): p.start for p in points.values()}
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING if s is None else s) for (t, p), s in starts.items()])
        for msg in read_to_end(consumer, set(starts), SCAN_IDLE_S):
            for name, value in msg.headers() or ():
                if name == provenance.SOURCE and value is not None:
                    prefix, _, offset = value.rpartition(b"/")
                    tp = wanted[(msg.topic(), msg.partition())].get(prefix + b"/")
                    if tp is not None:
                        found[tp] = max(found.get(tp, 0), int(offset) + 1)
    except PartitionReadError as exc:
        raise TransactionError(f"reading the destination to resume: {exc}") from None
    finally:
        consumer.close()
    return found
