"""Exactly-once mode (`exactly.once.support=required`): a task's destination transactions and where it resumes.

A task writes through one transactional producer, `transactional.id` = `mirus-<connector>-<task>`: its
`init_transactions` fences every earlier instance of the same task (their open transaction is aborted, their
later writes refused). Every `offset.flush.interval.ms` the task lets its in-flight records be acknowledged,
commits the transaction and only then stores the partitions' next source offsets in Postgres (epoch-fenced), with
each destination partition's offset after the transaction's last record. A crash between the two leaves the
destination ahead of Postgres; `replicator.engine.destination_copies` closes that gap by reading each destination
partition (`read_committed`) forward from the stored destination offset and finding the last copy of the source
partition by its `mirus.source` header. An aborted transaction's records are never seen by `read_committed` readers, so
the task rewinds every partition to its last committed record and writes them again.

`TransactionalCommitter` is the task's committer in this mode (`replicator.engine.committer` has the interface and
the at-least-once one): intake stops until every record is acknowledged, the destination transaction commits, and
only then are the offsets it covers written to Postgres; an aborted transaction rewinds every partition, and a
partition starts after the destination's last copy of it.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from replicator.assignment import SourcePartition
from replicator.engine.committer import COMMIT_WAIT_S, Committer
from replicator.engine.deliveries import ACK_POLL_S, MAX_BLOCK_S, close_producer
from replicator.engine.destination_copies import DestinationReadError, copies_end
from replicator.engine.partitions import PartitionState
from replicator.state.records import FencedError

# A newer producer with the same transactional.id exists: this instance must stop (as a fenced Postgres write).
# A stop commits the open transaction within this long, after the task's drain, or leaves it to the next owner.
STOP_COMMIT_S = 2.0
FENCED_CODES = {KafkaError.PRODUCER_FENCED, KafkaError._FENCED, KafkaError.INVALID_PRODUCER_EPOCH}


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

    def start(self, timeout_s: float, should_stop: Callable[[], bool] = lambda: False) -> bool:
        """Fence earlier instances of this transactional.id and open the first transaction; False if `should_stop`
        said so first (asked every second: a destination that does not answer must not hold a stop)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.producer.init_transactions(min(1.0, max(deadline - time.monotonic(), 0.1)))
                break
            except KafkaException as exc:
                err = _error(exc)
                if err.code() in FENCED_CODES:
                    _raise_fatal(err, self.what)
                if err.retriable() and time.monotonic() < deadline:
                    if should_stop():
                        return False
                    continue  # librdkafka: "retry call to resume"
                raise TransactionError(
                    f"{self.what}: the destination cannot run transactions, which exactly.once.support needs "
                    f"({err.name()}: {err.str()})"
                ) from None
        self.begin()
        return True

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


def fence(settings: dict[str, Any], timeout_s: float) -> None:
    """Fence the task whose producer `settings` are: its open transaction is aborted, its later writes refused."""
    producer = Producer(settings)
    try:
        producer.init_transactions(timeout_s)
    except KafkaException as exc:
        err = _error(exc)
        raise TransactionError(f"fencing {settings['transactional.id']} failed ({err.name()}: {err.str()})") from None
    finally:
        close_producer(producer)


class TransactionalCommitter(Committer):
    """Exactly-once: every commit is a destination transaction's, and what Postgres stores is only ever what a
    committed transaction holds (`PartitionState.durable_offset`)."""

    skips_untouched = False  # a transaction's commit moves what may be committed without touching the book
    transactions: Transactions | None = None  # once the task is owned (a standby's must not fence the owner)
    due = False  # the transaction commits once its records are acknowledged; intake waits
    abort_reason: str | None = None  # a record of the transaction failed: it must be aborted

    def start(self) -> None:
        """`init_transactions` fences older instances of this task, then the first one begins."""
        self.due, self.abort_reason = False, None
        self.transactions = Transactions(self.deliveries.producer, f"task {self.connector}-{self.task_id}")
        self.transactions.start(COMMIT_WAIT_S, self.should_stop)  # stopped first: the loop ends before any write

    def accepting(self) -> bool:
        return not self.due

    def ack_wait_s(self) -> float:
        return ACK_POLL_S if self.due else 0.0

    def settle(self) -> None:
        """Exactly once, a refused record aborts the transaction (and its partition waits for its backoff); a record
        an abort or a replaced producer purged is no refusal (its partition was rewound and writes it again); a failed
        producer is replaced and every partition rewinds."""
        self._settle_refusals()
        deliveries = self.deliveries
        if (failure := deliveries.take_failure()) is not None:
            self.producer_failed(failure)
        elif deliveries.cut_runs and not len(deliveries):
            deliveries.conclude_cut_runs(delivered=True)

    def _settle_refusals(self) -> None:
        for refusal in self.deliveries.take_refusals():
            if refusal.purged:
                continue
            if refusal.sent:  # (a record refused before it was produced is in no transaction)
                state, err = refusal.state, refusal.err
                where = f"{state.topic}[{state.partition}] offset {refusal.offset}: {err.name()}"
                self.abort_reason = self.abort_reason or where
            self.failures.decide(refusal)

    def producer_failed(self, err: KafkaError) -> None:
        """The producer failed fatally (`settle` and `_end_transaction` notice): fenced, the task stops; otherwise a
        new producer fences it and every partition rewinds."""
        if err.code() in FENCED_CODES:
            raise FencedError(f"the destination fenced this task's transactional producer ({err.name()})")
        self._replace_producer(f"{err.name()}: {err.str()}")

    def find_copies(
        self, partitions: list[SourcePartition], stored: dict[SourcePartition, int]
    ) -> set[SourcePartition]:
        """Exactly once, a partition starts after its last committed copy at the destination when that is ahead of
        Postgres (the task stopped between a transaction's commit and the offsets' commit). Returns the partitions
        with copies after their last commit's destination offset (flowing when the last owner stopped)."""
        try:
            found = self._committed_copies(partitions)
        except DestinationReadError as exc:
            if self.should_stop():
                return set()  # the loop stops before it reads or writes anything
            raise TransactionError(str(exc)) from None
        for tp, offset in found.items():
            if offset > stored.get(tp, 0):
                self.on_event(
                    f"{tp[0]}[{tp[1]}] resumes at {offset} after its last copy at the destination "
                    f"(Postgres had {stored.get(tp)})"
                )
                stored[tp] = offset
        return set(found)

    def _committed_copies(self, partitions: list[SourcePartition]) -> dict[SourcePartition, int]:
        """Per partition, the source offset after its last copy that a committed transaction holds at the
        destination (absent: none after the destination offset stored with the last Postgres commit)."""
        points = self.search_points(partitions, self.store.load_destination_offsets(self.connector, partitions))
        self.on_event(f"looking up the last copies of {len(points)} partition(s) at the destination")
        return copies_end(
            self.config.admin_settings("destination"), self.clients.source_cluster, points, should_stop=self.should_stop
        )

    def claimed_from(self, silent_tasks: set[int]) -> None:
        # Their open transaction may hold the partitions' records: fencing their transactional.id aborts it before
        # anything of ours is written or read.
        for silent in sorted(silent_tasks):
            fence(self.config.producer_settings(silent), COMMIT_WAIT_S)
            self.on_event(f"fenced silent task {silent}'s transactions before taking its partitions over")

    def offset_of(self, state: PartitionState) -> int | None:
        return state.durable_offset

    def destination_offsets(self, offsets: dict[SourcePartition, int]) -> dict[SourcePartition, int] | None:
        states = self.book.states
        ends = {tp: states[tp].durable_destination_offset for tp in offsets if tp in states}
        return {tp: end for tp, end in ends.items() if end is not None}

    def commit_due(self) -> None:
        self.due = True

    def after_tick(self) -> None:
        if self.due or self.abort_reason is not None:
            self._end_transaction()
            if self.in_flight is None and self.book.changed(self.offset_of):
                self.commit_in_background()  # what the transaction made durable, at once

    def before_commit_now(self, final: bool) -> None:
        if self.transactions is None or not self.transactions.open:
            return
        if final:
            self._commit_before_stopping()
        else:
            self._end_transaction(COMMIT_WAIT_S)

    def _commit_before_stopping(self) -> None:
        """A stop commits the open transaction if the destination acknowledges and commits it within STOP_COMMIT_S.
        Otherwise the transaction is left open: the next owner's `init_transactions` aborts it, and Postgres keeps
        the offsets of the last committed one (`offset_of` is the durable offset) — a stop must not wait longer."""
        assert self.transactions is not None
        deliveries = self.deliveries
        deadline = time.monotonic() + STOP_COMMIT_S
        while len(deliveries) and time.monotonic() < deadline:
            deliveries.poll_acks(0.1)
        self._settle_refusals()
        if len(deliveries) or self.abort_reason is not None or deliveries.failure is not None:
            return
        deliveries.acknowledge_cut_runs()
        try:
            while time.monotonic() < deadline:
                if self.transactions.commit(min(1.0, max(deadline - time.monotonic(), 0.1))) is CommitResult.COMMITTED:
                    self._made_durable()
                    return
        except (TransactionAborted, TransactionError) as exc:
            self.on_event(f"the last transaction was not committed ({exc}); the next owner aborts it")

    # -- end the transaction, or abort it and rewind ----------------------------------------------------------

    def _end_transaction(self, wait_s: float = 0.0, reopen: bool = True) -> None:
        """Commit the transaction once its records are acknowledged; with `wait_s`, wait that long and abort if it
        could not commit (a partition changing hands must not leave an open transaction behind)."""
        assert self.transactions is not None
        deliveries = self.deliveries
        deadline = time.monotonic() + wait_s
        while len(deliveries) and self.abort_reason is None and deliveries.failure is None:
            if time.monotonic() >= deadline:
                if not wait_s:
                    return  # acknowledgements still due: the loop polls for them and calls again
                self.abort_reason = f"records not acknowledged within {wait_s:.0f}s"
                break
            deliveries.poll_acks(0.1)
            self._settle_refusals()
        if (failure := deliveries.failure) is not None:
            deliveries.take_failure()
            self.producer_failed(failure)  # aborts (fences) the transaction and rewinds
            return
        deliveries.acknowledge_cut_runs()  # before `first_unacknowledged()` says what the transaction holds
        try:
            while self.abort_reason is None:
                if self.transactions.commit(MAX_BLOCK_S) is CommitResult.COMMITTED:
                    self._made_durable()
                    if reopen:
                        self.transactions.begin()
                    return
                if time.monotonic() >= deadline:
                    if not wait_s:
                        return  # the coordinator is slow or away: retried on the next loop
                    self.abort_reason = f"transaction not committed within {wait_s:.0f}s"
        except TransactionAborted as exc:
            self.abort_reason = str(exc)
        except TransactionError as exc:
            self._replace_producer(str(exc))
            return
        self._abort_and_rewind(reopen)

    def _made_durable(self) -> None:
        """The transaction committed: its records are at the destination for good, and their offsets may be stored."""
        self.due = False
        for state in self.book.states.values():
            state.made_durable()

    def _abort_and_rewind(self, reopen: bool = True) -> None:
        assert self.transactions is not None
        deliveries = self.deliveries
        reason, self.abort_reason = self.abort_reason, None
        self.on_event(f"transaction aborted ({reason}): every partition resumes after its last committed record")
        try:
            self.transactions.abort(COMMIT_WAIT_S)
            deadline = time.monotonic() + COMMIT_WAIT_S
            while len(deliveries) and time.monotonic() < deadline:  # purged records come back as refusals
                deliveries.poll_acks(0.1)
        except TransactionError as exc:
            # E.g. a broker before 2.5 cannot bump the producer epoch after a failed batch (KIP-360): the producer
            # is done for. A new one fences it, which aborts its transaction, as a task restart would.
            self._replace_producer(str(exc))
            return
        self.due = False
        self._rewind()
        if reopen:
            self.transactions.begin()

    def _replace_producer(self, reason: str) -> None:
        """A new producer fences the failed one; every partition rewinds to what is committed at the destination.

        Fencing does not always abort: a commit the coordinator had begun is completed (the new producer's
        `init_transactions` waits for it), although the failed producer never got its answer (a commit that timed
        out and then failed, or an abort refused while that commit was in progress). So the partitions resume after
        their last committed copy at the destination, as at a start; rewinding to the last commit this instance saw
        would write such a transaction's records twice."""
        deliveries = self.deliveries
        self.on_event(f"transactional producer failed ({reason}); replacing it, every partition rewinds")
        deliveries.purge()  # its records come back as purged refusals, which `settle` leaves to the rewind
        deliveries.take_failure()
        deliveries.replace_producers()
        self.start()
        try:
            found = self._committed_copies(list(self.book.states))
        except DestinationReadError as exc:
            raise TransactionError(f"after replacing the transactional producer: {exc}") from None
        for tp, offset in found.items():
            state = self.book.states[tp]
            if state.durable_offset is None or offset > state.durable_offset:
                self.on_event(
                    f"{tp[0]}[{tp[1]}] resumes at {offset} after its last committed copy (a commit whose answer "
                    f"was lost; this task had seen {state.durable_offset})"
                )
                state.durable_at(offset)
        self._rewind()

    def _rewind(self) -> None:
        """Read every partition again from its last committed position (nothing after it is visible)."""
        book = self.book
        resets = self.reset_offsets([tp for tp, state in book.states.items() if state.durable_offset is None])
        positions = []
        for state in book.states.values():
            state.rewound()
            if state.routed:
                state.route(state.destination_partition, self.config.ordered_acks)
            offset = resets[state.tp] if state.durable_offset is None else state.durable_offset
            positions.append(TopicPartition(state.topic, state.partition, offset))
        if positions:
            self.clients.reader.unassign(list(book.states))
            self.clients.reader.assign(positions)
        if book.paused:
            self.clients.reader.pause(list(book.paused))
