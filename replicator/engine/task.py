"""One replicator task: a consumer on the source cluster and a producer on the destination, for a set of
source partitions.

A record's path, top to bottom in this file:
  fetch      `_poll_once`: `SourceReader.consume()` on assigned partitions (no consumer group), forwarding at
             once; partitions that flow are fetched eagerly, quiet ones cheaply (`replicator.engine.source_reader`)
  map        `_forward`: destination topic and partition, user headers plus provenance headers, cycle guard
  produce    `_forward`: `producer.produce()` with key, value, headers and source timestamp (`_produce_again` when
             the local queue is full or the record is refused before sending)
  acknowledge `_acknowledged`: the destination acknowledged (or refused) a run of records (`InFlight`); with an
             idempotent, gapless producer one acknowledgement stands for every earlier record of the partition
  commit     `_commit_in_background`: per partition, the first offset not yet acknowledged goes to Postgres under
             the lease epoch
Exactly-once (`replicator.engine.transactions`) adds, before commit, `_end_transaction`: intake stops until every record
is acknowledged, the destination transaction commits, and only then are the offsets it covers written to Postgres;
an aborted transaction rewinds every partition (`_rewind`), and `_start` resumes after the destination's last copy.

Consumption never waits for commits: acknowledgements advance each partition on their own and a commit is one
small transaction every `offset.flush.interval.ms`, on a background thread.
"""

from __future__ import annotations

import enum
import gc
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from functools import partial
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from sqlalchemy.exc import SQLAlchemyError

from replicator.assignment import SourcePartition
from replicator.clusters import TopicPartitions, cluster_id, log_offsets, topic_partitions
from replicator.configuration.connector import ConnectorConfig, load
from replicator.engine.metrics import TaskMetrics
from replicator.engine.source_reader import DEFAULT_LIMITS, SourceReader, TierLimits
from replicator.engine.transactions import (
    FENCED_CODES,
    CommitResult,
    ResumePoint,
    TransactionAborted,
    TransactionError,
    Transactions,
    fence,
    resume_offsets,
)
from replicator.state.store import (
    ConnectorHead,
    ConnectorState,
    FencedError,
    Lease,
    MetricInterval,
    PartitionHealth,
    Store,
)
from replicator.topics import provenance

log = logging.getLogger(__name__)

UNASSIGNED_PARTITION = -1  # librdkafka: let the producer's partitioner choose
BATCH = 10000  # records taken from the consumer's queue at most per loop; never waited for
MAX_BLOCK_S = 1.0  # never block longer: a Dagster termination is delivered between bytecodes
# While records await acknowledgement, the loop waits for new records at most this long, so acknowledgements are
# served (and their time taken for the latency metric) within a few milliseconds of their arrival.
ACK_SERVE_S = 0.005
YOUNG_GC_THRESHOLD = 50_000  # allocations between young garbage collections (see `Task.run`)
REFUSAL_DRAIN_S = 5.0  # how long a refusal before sending waits for the records produced just before it
COMMIT_WAIT_S = 30  # how long a commit that must come first (hand-over, shutdown) may wait for the background one
RETRY_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 60.0)
SOURCE_GONE = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
# The task loop's periodic jobs besides committing (every offset.flush.interval.ms) and metrics (TaskMetrics).
# "refreshing": pause, delete, restart, new config versions and assignment generations (one indexed row read).
REFRESH_INTERVAL_S = 0.5
DESTINATION_CHECK_INTERVAL_S = 5.0  # "checking destinations": route or pause partitions by destination metadata
# ... per this many destination partitions: librdkafka's answer, turned into Python objects, costs ~17-20 us of CPU per
# partition (10,000: ~190 ms), so a task of 10,000 partitions checks every 50 s, at under 0.5 % of a core.
DESTINATION_CHECK_PARTITIONS = 1_000
REST_INTERVAL_S = 1.0  # "resting": flowing partitions that went quiet move to the reader's quiet tier
# The destination no longer accepts this producer's identity (id, epoch, sequence), or the producer stopped after
# an error that could leave a gap (`enable.gapless.guarantee`): retrying with the same producer cannot succeed, a
# new one can (seen after a network cut timed records out mid-flight). A timeout (only with a user-set
# `producer.message.timeout.ms`) replaces it too, so no later record of the partition is written before the
# timed-out one is sent again.
PRODUCER_BROKEN = {
    KafkaError._MSG_TIMED_OUT, KafkaError._FATAL,
    KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH, KafkaError._FENCED, KafkaError.UNKNOWN_PRODUCER_ID,
    KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, KafkaError.INVALID_PRODUCER_ID_MAPPING, KafkaError._INCONSISTENT,
}  # fmt: skip
# Records the task purged from a producer it is replacing: they are read again, they were not refused.
PURGED = {KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT}
# `paused_reason` of a partition whose record failed because the producer failed, not because the destination
# refused it: the rest of the batch skips the partition, and the new producer reads it again at once, no backoff.
AWAITING_NEW_PRODUCER = "awaiting the replacement of a failed producer"


class TaskExit(enum.Enum):
    STOPPED = "STOPPED"  # asked to stop (run terminated, process shutting down)
    REMOVED = "REMOVED"  # the task is no longer part of the connector's assignment
    PAUSED = "PAUSED"  # the operator paused the connector
    DELETED = "DELETED"  # the connector was deleted
    FENCED = "FENCED"  # a newer instance of this task took over


class CommitWatchdogError(RuntimeError):
    """Records flowed but no offset commit succeeded for `commit.failure.restart.ms`."""


class Periodic:
    """One named periodic job of the task loop (as MirrorMaker 2's `Scheduler` names its jobs)."""

    __slots__ = ("name", "next_at")

    def __init__(self, name: str) -> None:
        self.name = name
        self.next_at = 0.0  # due at once

    def due(self, now: float, interval_s: float) -> bool:
        """Whether the job runs now; if so, the next run is `interval_s` from `now`."""
        if now < self.next_at:
            return False
        self.next_at = now + interval_s
        return True


class InFlight:
    """Records of one source partition produced one after another and not yet acknowledged.

    Where the destination partition is fixed and acknowledgements stand for every earlier record of it (an
    idempotent producer with gapless ordering, or a transaction that commits only whole), only the last record of
    the run carries a delivery callback: one acknowledgement for the run. Elsewhere every record is its own run.
    """

    __slots__ = ("count", "done", "first", "size", "tail_sent", "timestamps")

    def __init__(self, first: int) -> None:
        self.first = first  # source offset of the run's first record: nothing from here on is acknowledged yet
        self.count = 0
        self.size = 0  # key + value bytes
        self.timestamps: list[int] = []  # CreateTime / LogAppendTime of each record that has one (ms)
        self.tail_sent = False  # whether a record carrying the run's callback was produced
        self.done = False


class PartitionState:
    """What the task knows about one owned source partition."""

    __slots__ = (
        "committed", "destination_durable", "destination_next", "destination_partition",
        "destination_topic", "durable", "failed_at", "failures", "in_flight", "open_run",
        "ordered", "partition", "paused_reason", "pending", "position", "retry_at", "routed", "source_prefix",
        "topic", "tp",
    )  # fmt: skip

    def __init__(self, tp: SourcePartition, start: int | None, destination_topic: str, source_cluster: str) -> None:
        self.tp = tp
        self.topic, self.partition = tp
        self.destination_topic = destination_topic
        self.destination_partition = UNASSIGNED_PARTITION
        self.routed = False  # whether destination metadata has decided `destination_partition` yet
        self.ordered = False  # whether one acknowledgement stands for a whole run (see InFlight)
        self.source_prefix = provenance.source_prefix(source_cluster, self.topic, self.partition)
        self.pending: deque[InFlight] = deque()  # produced and not yet acknowledged, in send order
        self.open_run: InFlight | None = None  # the run the next produced record joins
        self.position = start  # next source offset to forward; None until the first record arrives
        self.committed: int | None = start
        # Exactly-once: the next source offset and destination offset as of the last committed transaction.
        self.durable: int | None = start
        self.destination_durable: int | None = None
        self.destination_next: int | None = None  # after the last acknowledged copy
        self.failed_at: int | None = None  # first offset the destination refused since the last resume
        self.in_flight = 0  # records produced whose acknowledgement (or refusal) is still to come
        self.failures = 0
        self.paused_reason: str | None = None
        self.retry_at = 0.0

    def committable(self) -> int | None:
        """The first source offset not yet replicated: everything before it is acknowledged."""
        head = self.pending[0].first if self.pending else self.position
        if self.failed_at is not None and (head is None or self.failed_at < head):
            return self.failed_at
        return head

    def forget_in_flight(self) -> None:
        """Before re-reading from `committable()`: nothing produced so far is awaited any more."""
        self.pending.clear()
        self.open_run = None
        self.failed_at = None


class ReplicationTask:
    def __init__(
        self,
        store: Store,
        connector: str,
        task_id: int,
        owner: str,
        *,
        metrics_interval_s: float = 10.0,
        reader_limits: TierLimits = DEFAULT_LIMITS,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.connector = connector
        self.task_id = task_id
        self.owner = owner
        self.metrics = TaskMetrics(task_id, metrics_interval_s)
        self.reader_limits = reader_limits
        self.on_event = on_event or (lambda message: log.info("%s-%d: %s", connector, task_id, message))
        # Set by `run` (lease) and `_rebuild` (config and clients) before anything uses them.
        self.lease: Lease
        self.config: ConnectorConfig
        self.reader: SourceReader
        self.producer: Producer
        self.clients_open = False
        self.source_cluster = self.destination_cluster = ""  # Kafka cluster ids, read by `_rebuild`
        self.partitions: dict[SourcePartition, PartitionState] = {}
        self.paused: dict[SourcePartition, PartitionState] = {}  # the partitions whose `paused_reason` is set
        self.waiting: set[SourcePartition] = set()  # assigned to us, still owned by another live task
        self.generation = 0
        self.version = 0
        self.restart_marker: object = None
        self.fatal_producer_error: KafkaError | None = None
        self.ordered_acks = False  # the connector's `ordered_acks`, read once per configuration
        self.intake_limit = 0  # records waiting in the producer above which no more are read (`_rebuild`)
        self.transactions: Transactions | None = None  # exactly-once mode only
        # Whether this instance holds the task: a warm standby's prepared producer must not `init_transactions`,
        # which would fence the live owner's producer (same transactional.id).
        self.owning = False
        self.transaction_due = False  # the transaction commits once its records are acknowledged; intake waits
        self.abort_reason: str | None = None  # a record of the transaction failed: it must be aborted
        self.aborting = False
        self.unsettled = False  # runs cut short await the producer's emptying (`_settle`)
        self.now_ms = 0
        self.uncommitted = False  # acknowledged progress that the last commit attempt could not store
        self.last_commit_ok = time.monotonic()
        self.committing = Periodic("committing offsets")
        self.refreshing = Periodic("refreshing assignment and configuration")
        self.checking_destinations = Periodic("checking destination partitions")
        self.resting = Periodic("moving quiet partitions to cheap fetches")
        # Postgres commits, metric rows and destination metadata requests run beside the loop, never blocking a
        # record: one background thread, its results applied by the loop (`_collect_commit`, `_housekeeping`).
        self.background = ThreadPoolExecutor(1, thread_name_prefix=f"mirus-{connector}-{task_id}")
        self.commit_in_flight: tuple[Future[None], dict[SourcePartition, int]] | None = None
        self.metadata_in_flight: Future[dict[str, TopicPartitions]] | None = None
        self.head_in_flight: Future[ConnectorHead | None] | None = None  # the connector's row, read in the background
        self.commit_started = 0.0

    # -- lifecycle --------------------------------------------------------------------------------------

    def run(
        self, should_stop: Callable[[], bool] = lambda: False, lease: Lease | None = None, stood_by_s: float = 0.0
    ) -> TaskExit:
        """Replicate until stopped, removed, paused, deleted or fenced. Raises on failure (after cleaning up).

        `lease`: a claim already taken (`replicator.engine.ownership`), after standing by `stood_by_s`; without it the
        task claims now, fencing any owner.
        """
        # A batch of up to 10,000 records outlives many young collections while it is forwarded: at Python's
        # default threshold (700) its objects are promoted and full collections (45-117 ms each, the whole heap)
        # came every few seconds at 100,000 records/s. The task owns its process (one run, one task).
        gc.set_threshold(YOUNG_GC_THRESHOLD, *gc.get_threshold()[1:])
        self.lease = lease or self.store.claim_task(self.connector, self.task_id, self.owner)
        self.owning = True
        outcome: TaskExit | None = None
        error: BaseException | None = None
        try:  # from here on a termination (even while the first events are written) ends with a final commit
            if stood_by_s:
                self.on_event(f"took over after standing by {stood_by_s:.1f}s")
            self.on_event(f"claimed with epoch {self.lease.epoch}")
            if self.clients_open:  # prepared while standing by: its transactions start now, fencing the last owner
                self._start_transactions()
            outcome = self._refresh(self.store.connector_head(self.connector), force=True)
            while outcome is None:
                if should_stop():
                    outcome = TaskExit.STOPPED
                    break
                self._poll_once()
                outcome = self._housekeeping()
            return outcome
        except FencedError as exc:
            outcome = TaskExit.FENCED
            self.on_event(str(exc))
            return outcome
        except BaseException as exc:  # includes Dagster's run termination, delivered as a BaseException
            error = exc
            raise
        finally:
            self._shutdown(outcome, error)

    def prepare(self) -> None:
        """Create and connect the clients before owning the task (a warm standby): `run` then starts replicating
        at once, unless the configuration changed meanwhile."""
        head = self.store.connector_head(self.connector)
        if head is None:
            return
        self._rebuild(head.version, head.restart_requested_at)
        # The producer connected and holding the metadata of one of its topics (never the whole cluster's) before it
        # is needed. The source consumers are made at the takeover, in the quiet tier (answered at the first byte).
        mine = self.store.read_assignment(self.connector).get(self.task_id)
        if mine:
            try:
                self.producer.list_topics(self.config.namer.destination_topic(mine[0][0]), timeout=5)
            except Exception as exc:  # only slower later: the task loop reports real trouble
                log.info("%s-%d: warming up the producer failed: %s", self.connector, self.task_id, exc)

    def discard(self) -> None:
        """Close the clients of a task that was prepared but never ran."""
        if self.clients_open:
            self.reader.close()
            self.clients_open = False

    def _shutdown(self, outcome: TaskExit | None, error: BaseException | None) -> None:
        fenced = outcome is TaskExit.FENCED
        try:
            if self.clients_open and not fenced:
                self._drain(10)
            if not fenced:
                self._commit(final=True)
                if self.clients_open:
                    self._record_metrics()
        except FencedError:
            fenced = True
        except Exception as exc:  # the original outcome matters more than a failed final commit
            log.warning("final commit of %s-%d failed: %s", self.connector, self.task_id, exc)
        finally:
            try:
                self.background.shutdown(wait=True)
                if self.clients_open:
                    self.reader.close()
                if not fenced:
                    state = "FAILED" if isinstance(error, Exception) else (outcome.value if outcome else "STOPPED")
                    self.store.finish_task(self.lease, state, f"{type(error).__name__}: {error}" if error else None)
            finally:  # a second termination while closing must not cost the run its last event
                self.on_event(f"stopped: {outcome.value if outcome else type(error).__name__}")

    # -- fetch, map, produce ----------------------------------------------------------------------------

    def _poll_once(self) -> None:
        reader, producer = self.reader, self.producer
        timeout = min(self.config.poll_timeout_ms / 1000, MAX_BLOCK_S)
        if not self.partitions:
            time.sleep(min(timeout, 0.2))  # nothing assigned yet; housekeeping will pick work up
            return
        # Forward whatever has arrived, at once: `consume(n, t)` would hold records back until n arrived or t
        # passed. Only an empty queue is waited on, and only until its first record (or an acknowledgement) is due.
        if self.transaction_due:  # exactly-once: no intake until the transaction's records are acknowledged
            msgs = []
        elif len(producer) > self.intake_limit:
            # The destination is behind (e.g. thousands of partitions catching up, each sent as a request of its
            # own): read no more until a batch fits, so the backlog waits in Kafka, not in this process's memory.
            msgs = []
            self._serve(producer, ACK_SERVE_S)
        else:
            msgs = reader.consume(BATCH, 0)
            if not msgs:
                msgs = reader.consume(1, ACK_SERVE_S if len(producer) else timeout)
        if msgs:
            self._forward(msgs)
        self.now_ms = time.time_ns() // 1_000_000  # acknowledgement time of everything this poll serves
        self._serve(producer, ACK_SERVE_S if self.transaction_due else 0)
        if self.fatal_producer_error is not None:
            self._recreate_producer()
        elif self.unsettled and not len(producer):
            self._settle(delivered=True)

    def _forward(self, msgs: list[Message]) -> None:
        """Map and produce a batch of records, in order. This loop runs once per record: it stays flat, and the
        produce call is inline (a method call per record costs as much as the bookkeeping).

        Each record is produced once the next one is seen, which tells whether it ends its partition's run in this
        batch: only a run's last record carries a delivery callback (`InFlight`). The batch ends with `None`."""
        produce, acknowledged = self.producer.produce, self._acknowledged
        partitions, with_provenance = self.partitions, self.config.provenance_headers
        destination, origin_header, source = self.destination_cluster, self.origin_header, provenance.SOURCE
        # The record seen and not yet produced: it, its partition, offset, outgoing headers and timestamp.
        held: Message | None = None
        # Read only while `held` is set: an Optional would cost a check per record.
        hstate: PartitionState = None  # type: ignore[assignment]
        hoffset = hts = 0
        hheaders: Any = None
        state: PartitionState | None = None
        for msg in (*msgs, None):
            cycle = False  # the record was first produced on the destination cluster: never written back
            if msg is not None:
                if msg.error() is not None:
                    self._source_error(msg)
                    continue
                state = partitions.get((msg.topic(), msg.partition()))
                if state is None or state.paused_reason is not None:
                    continue  # released or paused while the batch was in flight; re-read from its offset later
                offset = msg.offset()
                headers = msg.headers()
                if headers is not None:
                    origin = provenance.origin_cluster(headers)
                    if origin == destination:
                        cycle = True
                    elif with_provenance:
                        headers = provenance.user_headers(headers)
                        headers.append((provenance.ORIGIN, origin.encode()) if origin else origin_header)
                        headers.append((source, state.source_prefix + b"%d" % offset))
                elif with_provenance:
                    headers = [origin_header, (source, state.source_prefix + b"%d" % offset)]
            else:
                state = None
            if held is not None:  # produce it: it ends its run unless the next record continues the run
                run = hstate.open_run
                if run is None:
                    run = hstate.open_run = InFlight(hoffset)
                    hstate.pending.append(run)
                last = cycle or hstate is not state or not hstate.ordered
                key, value = held.key(), held.value()
                callback = partial(acknowledged, hstate, run) if last else None
                try:
                    # Positional: confluent-kafka parses keyword arguments at a cost per record (~0.3 µs). The order
                    # is its keyword list's: topic, value, key, partition, callback, on_delivery, timestamp, headers.
                    produce(hstate.destination_topic, value, key, hstate.destination_partition, callback, None, hts,
                            hheaders)  # fmt: skip
                    produced = True
                except (BufferError, KafkaException) as exc:
                    produced = self._produce_again(exc, hstate, run, hoffset, value, key, callback, hts, hheaders)
                if produced:
                    hstate.position = hoffset + 1
                    hstate.in_flight += 1
                    run.count += 1
                    run.size += (len(value) if value else 0) + (len(key) if key else 0)
                    if hts:
                        run.timestamps.append(hts)
                    if last:
                        run.tail_sent = True
                        hstate.open_run = None
                held = None
            if msg is None or state is None or state.paused_reason is not None:
                continue  # the end, or the record before it was refused: it is re-read from its offset later
            if cycle:
                state.position = offset + 1
                continue
            ts_type, ts = msg.timestamp()
            held, hstate, hoffset, hheaders, hts = msg, state, offset, headers, ts if ts_type else 0

    def _produce_again(
        self, exc: Exception, state: PartitionState, run: InFlight, offset: int, value: bytes | None,
        key: bytes | None, callback: Callable[..., None] | None, ts: int, headers: Any,
    ) -> bool:  # fmt: skip
        """`produce()` raised: serve acknowledgements while the local queue is full, then try again; a record refused
        before sending pauses its partition and cuts its run short. Whether the record was produced."""
        while isinstance(exc, BufferError):
            self._serve(self.producer, 0.05)
            try:
                self.producer.produce(state.destination_topic, value, key, state.destination_partition, callback,
                                      None, ts, headers)  # fmt: skip
                return True
            except (BufferError, KafkaException) as again:
                exc = again
        assert isinstance(exc, KafkaException)  # refused before sending: too large, or the producer stopped
        state.open_run = None
        if not run.count:
            state.pending.pop()
        self._refused(state, offset, exc.args[0])
        if run.count:  # the run's records so far carry no callback: find out whether they arrived
            self._drain(REFUSAL_DRAIN_S)
        return False

    # -- acknowledge ------------------------------------------------------------------------------------

    def _acknowledged(self, state: PartitionState, run: InFlight, err: KafkaError | None, msg: Message | None) -> None:
        """The destination acknowledged (or refused) a run's last record, and with it the whole run."""
        state.in_flight -= run.count
        if err is not None:
            self._refused(state, run.first, err)  # the run stays in `pending`: nothing is committed past it
            return
        run.done = True
        pending = state.pending
        while pending and pending[0].done:
            pending.popleft()
        # Counted into the topic's counters at once: records, bytes and each record's latency (source CreateTime to
        # acknowledgement). Per record, not sampled: a backlog mixes old and new records, and the latency report's
        # buckets (Mirus's 5m … 12h) must count each one where it belongs. A run at a time: no pause to fold a busy
        # second.
        acknowledged = self.metrics.counters_for(state.topic)
        acknowledged.add(run.count, run.size)
        acknowledged.add_latencies(self.now_ms, run.timestamps)
        if msg is not None and state.ordered:
            state.destination_next = msg.offset() + 1

    def _drain(self, timeout: float) -> None:
        """Wait until the producer has delivered everything, serving acknowledgements, and settle the runs cut short
        (see `_settle`) once it has; a fatal error ends the wait (the loop replaces the producer).

        Not `flush()`: a fatal error raised while confluent-kafka's flush waits comes out as a SystemError or as an
        object no `except` clause catches (seen on a gapless producer whose batch the broker refused), where
        `poll()` raises it as the KafkaException `_serve` handles."""
        producer = self.producer
        deadline = time.monotonic() + timeout
        while len(producer) and self.fatal_producer_error is None and (left := deadline - time.monotonic()) > 0:
            self._serve(producer, min(left, 0.1))
        if not len(producer) and self.fatal_producer_error is None:
            self._settle(delivered=True)
        else:
            self.unsettled = True  # settled by the loop once the producer is empty (or given up with it)

    def _settle(self, delivered: bool) -> None:
        """Runs whose last record carried no callback (cut short by a refusal of the next record, or by an
        interruption): acknowledged once the producer has delivered everything without a fatal error (with gapless
        ordering, or inside a transaction, nothing of them can then be missing); given up otherwise — they stay at
        the head of `pending`, so their partition is re-read from their first offset when it resumes."""
        self.unsettled = False
        for state in self.partitions.values():
            state.open_run = None
            for run in [r for r in state.pending if not r.tail_sent]:
                run.tail_sent = True
                if delivered:
                    self._acknowledged(state, run, None, None)
                else:
                    state.in_flight -= run.count

    def _refused(self, state: PartitionState, offset: int, err: KafkaError) -> None:
        if self.aborting:
            return  # purged by an abort: the partition is rewound and the record written again
        if self.transactions is not None:
            self.abort_reason = self.abort_reason or f"{state.topic}[{state.partition}] offset {offset}: {err.name()}"
        if state.failed_at is None or offset < state.failed_at:
            state.failed_at = offset
        if err.fatal() or err.code() in PRODUCER_BROKEN or err.code() in PURGED:
            # The producer failed, not this partition's record: every partition would see the same. Pausing it
            # with a backoff would stop partitions the destination accepts whenever another one's refusal stops
            # the producer (a gapless producer stops on any refused batch).
            if err.code() not in PURGED:
                self.fatal_producer_error = err
            if state.paused_reason is None:
                state.paused_reason = AWAITING_NEW_PRODUCER
            return
        # (A record of this partition may have failed with the stopped producer before its refusal was served.)
        if state.paused_reason is None or state.paused_reason is AWAITING_NEW_PRODUCER:
            self._pause(state, f"destination refused offset {offset}: {err.str()} ({err.name()})")

    # -- commit -----------------------------------------------------------------------------------------

    def _committable(self) -> dict[SourcePartition, int]:
        offsets = {}
        exactly_once = self.transactions is not None
        for state in self.partitions.values():
            offset = state.durable if exactly_once else state.committable()
            if offset is not None and offset != state.committed:
                offsets[state.tp] = offset
        return offsets

    def _commit(self, final: bool = False) -> None:
        """Commit now, in this thread (a final commit, or before partitions change hands)."""
        self._collect_commit(wait=True)  # never let an older commit land after this one
        if self.transactions is not None and self.transactions.open:
            self._end_transaction(COMMIT_WAIT_S, reopen=not final)
        offsets = self._committable()
        try:
            self.store.commit(self.lease, offsets, self._destination_offsets(offsets))
        except SQLAlchemyError as exc:
            if final:
                raise
            self._commit_failed(offsets, exc)
            return
        self._committed(offsets)

    def _commit_in_background(self) -> None:
        offsets = self._committable()
        self.commit_started = time.monotonic()
        future = self.background.submit(self.store.commit, self.lease, offsets, self._destination_offsets(offsets))
        self.commit_in_flight = (future, offsets)

    def _destination_offsets(self, offsets: dict[SourcePartition, int]) -> dict[SourcePartition, int] | None:
        """Exactly-once: where the committed copies of `offsets`' partitions end at the destination."""
        if self.transactions is None:
            return None
        ends = {tp: self.partitions[tp].destination_durable for tp in offsets if tp in self.partitions}
        return {tp: end for tp, end in ends.items() if end is not None}

    # -- exactly-once: end the transaction, or abort it and rewind ---------------------------------------

    def _end_transaction(self, wait_s: float = 0.0, reopen: bool = True) -> None:
        """Commit the transaction once its records are acknowledged; with `wait_s`, wait that long and abort if it
        could not commit (a partition changing hands must not leave an open transaction behind)."""
        assert self.transactions is not None
        producer = self.producer
        deadline = time.monotonic() + wait_s
        while len(producer) and self.abort_reason is None and self.fatal_producer_error is None:
            if time.monotonic() >= deadline:
                if not wait_s:
                    return  # acknowledgements still due: the loop serves them and calls again
                self.abort_reason = f"records not acknowledged within {wait_s:.0f}s"
                break
            self._serve(producer, 0.1)
        if self.fatal_producer_error is not None:
            self._recreate_producer()  # aborts (fences) the transaction and rewinds
            return
        if self.unsettled and not len(producer):
            self._settle(delivered=True)  # before `committable()` says what the transaction holds
        try:
            while self.abort_reason is None:
                if self.transactions.commit(MAX_BLOCK_S) is CommitResult.COMMITTED:
                    self.transaction_due = False
                    for state in self.partitions.values():
                        state.durable = state.committable()
                        state.destination_durable = state.destination_next
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
            self._replace_transactional_producer(str(exc))
            return
        self._abort_and_rewind(reopen)

    def _abort_and_rewind(self, reopen: bool = True) -> None:
        assert self.transactions is not None
        reason, self.abort_reason = self.abort_reason, None
        self.on_event(f"transaction aborted ({reason}): every partition resumes after its last committed record")
        self.aborting = True
        try:
            self.transactions.abort(COMMIT_WAIT_S)
            deadline = time.monotonic() + COMMIT_WAIT_S
            while len(self.producer) and time.monotonic() < deadline:  # purged records come back as refusals
                self._serve(self.producer, 0.1)
        except TransactionError as exc:
            # E.g. a broker before 2.5 cannot bump the producer epoch after a failed batch (KIP-360): the producer
            # is done for. A new one fences it, which aborts its transaction, as a task restart would.
            self._replace_transactional_producer(str(exc))
            return
        finally:
            self.aborting = False
        self.transaction_due = False
        self._rewind()
        if reopen:
            self.transactions.begin()

    def _rewind(self) -> None:
        """Exactly-once: read every partition again from its last committed position (nothing after it is visible)."""
        resets = self._reset_offsets([tp for tp, state in self.partitions.items() if state.durable is None])
        positions = []
        for state in self.partitions.values():
            if state.paused_reason is AWAITING_NEW_PRODUCER:
                state.paused_reason = None
            state.forget_in_flight()
            state.in_flight = 0
            state.position = state.durable
            state.destination_next = state.destination_durable
            if state.routed:
                self._route(state, state.destination_partition)
            offset = resets[(state.topic, state.partition)] if state.durable is None else state.durable
            positions.append(TopicPartition(state.topic, state.partition, offset))
        if positions:
            self.reader.unassign(list(self.partitions))
            self.reader.assign(positions)
        if self.paused:
            self.reader.pause(list(self.paused))

    def _collect_commit(self, wait: bool = False) -> None:
        """Apply the outcome of the background commit once it is done (raises FencedError if it was fenced)."""
        if self.commit_in_flight is None or not (wait or self.commit_in_flight[0].done()):
            return
        (future, offsets), self.commit_in_flight = self.commit_in_flight, None
        try:
            future.result(timeout=COMMIT_WAIT_S)
        except TimeoutError:
            log.warning("offset commit of %s-%d still running after %ss", self.connector, self.task_id, COMMIT_WAIT_S)
            self.uncommitted = bool(offsets)
            return
        except SQLAlchemyError as exc:
            self._commit_failed(offsets, exc)
            return
        self._committed(offsets)

    def _committed(self, offsets: dict[SourcePartition, int]) -> None:
        for tp, offset in offsets.items():
            state = self.partitions.get(tp)
            if state is not None:  # (a partition may have been dropped while its commit was under way)
                state.committed = offset
                if state.paused_reason is None:
                    state.failures = 0  # progress since the last refusal: the next one starts its backoff over
        self.last_commit_ok = time.monotonic()
        self.uncommitted = False

    def _commit_failed(self, offsets: dict[SourcePartition, int], exc: SQLAlchemyError) -> None:
        log.warning("offset commit of %s-%d failed, will retry: %s", self.connector, self.task_id, exc)
        self.uncommitted = bool(offsets)

    # -- housekeeping: commits, changes, retries, metrics -----------------------------------------------

    def _housekeeping(self) -> TaskExit | None:
        now = time.monotonic()
        self._collect_commit()
        if self.committing.due(now, self.config.offset_commit_interval_ms / 1000):
            self.transaction_due = self.transactions is not None
            if self.commit_in_flight is None:
                self._commit_in_background()
            watchdog_s = self.config.commit_failure_restart_ms / 1000
            hanging = self.commit_in_flight is not None and now - self.commit_started > watchdog_s
            if (self.uncommitted or hanging) and now - self.last_commit_ok > watchdog_s:
                raise CommitWatchdogError(
                    f"no offset commit succeeded for {now - self.last_commit_ok:.0f}s while "
                    "records were being replicated (commit.failure.restart.ms)"
                )
        elif self.commit_in_flight is None and now - self.commit_started >= self.config.heartbeat_interval_ms / 1000:
            # Every commit heartbeats the lease; between commits further apart than task.heartbeat.interval.ms, a
            # heartbeat alone keeps a standby from taking a live task over once task.lease.timeout.ms has passed.
            self.commit_started = now
            self.commit_in_flight = (self.background.submit(self.store.commit, self.lease, {}), {})
        if self.transactions is not None and (self.transaction_due or self.abort_reason is not None):
            self._end_transaction()
            if self.commit_in_flight is None and self._committable():
                self._commit_in_background()  # what the transaction made durable, at once
        # The connector's row is read off the loop (a query is milliseconds the records would wait) and acted on here.
        if self.head_in_flight is not None and self.head_in_flight.done():
            future, self.head_in_flight = self.head_in_flight, None
            try:
                outcome = self._refresh(future.result())
            except SQLAlchemyError as exc:  # the database is away: keep replicating, commits retry, so does this
                log.warning("reading the connector %s failed, will retry: %s", self.connector, exc)
                outcome = None
            if outcome is not None:
                return outcome
        if self.head_in_flight is None and self.refreshing.due(now, REFRESH_INTERVAL_S):
            self.head_in_flight = self.background.submit(self.store.connector_head, self.connector)
        if self.metadata_in_flight is not None and self.metadata_in_flight.done():
            future, self.metadata_in_flight = self.metadata_in_flight, None
            if future.exception() is None:
                self._map_destinations(list(self.partitions.values()), future.result())
            else:
                log.warning("destination metadata unavailable for %s-%d: %s", self.connector, self.task_id,
                            future.exception())  # fmt: skip
        if (
            self.metadata_in_flight is None
            and self.partitions
            and self.checking_destinations.due(
                now, DESTINATION_CHECK_INTERVAL_S * max(1.0, len(self.partitions) / DESTINATION_CHECK_PARTITIONS)
            )
        ):
            topics = {state.destination_topic for state in self.partitions.values()}
            self.metadata_in_flight = self.background.submit(self._destination_layouts, topics)
        if self.resting.due(now, REST_INTERVAL_S):
            self.reader.settle(self._position)
        for state in [s for s in self.paused.values() if s.in_flight == 0 and now >= s.retry_at]:
            self._resume(state)
        if self.metrics.due():
            self._record_metrics()
        return None

    def _refresh(self, head: ConnectorHead | None, force: bool = False) -> TaskExit | None:
        """Notice pause, delete, restart, new config versions and new assignment generations in the connector's
        row, as `Store.connector_head` read it."""
        if head is None:
            return TaskExit.DELETED
        if head.state == ConnectorState.PAUSED:
            return TaskExit.PAUSED
        if not self.clients_open or head.version != self.version or head.restart_requested_at != self.restart_marker:
            self._rebuild(head.version, head.restart_requested_at)
        if force or head.assignment_generation != self.generation:
            self.generation = head.assignment_generation
            assignment = self.store.read_assignment(self.connector, self.generation)
            if self.generation > 0 and self.task_id not in assignment:
                return TaskExit.REMOVED
            self._apply_assignment(set(assignment.get(self.task_id, ())))
        if self.waiting:
            self._claim(sorted(self.waiting))
        return None

    def _rebuild(self, version: int, restart_marker: object) -> None:
        """(Re)create clients for the current configuration, resuming every owned partition from its commit."""
        record = self.store.get_connector(self.connector)
        config = load(record.properties)
        owned = sorted(self.partitions)
        if self.clients_open:
            self.on_event(f"configuration version {record.version}: restarting clients in place")
            self._drain(10)
            self._commit()
            self.reader.close()
        self.config = config
        self.ordered_acks = config.ordered_acks
        self.version, self.restart_marker = record.version, restart_marker
        self.reader = SourceReader(config.consumer_settings(), self.reader_limits)
        self.producer = Producer(self._producer_settings(config))
        queue_limit = int(config.producer_settings(self.task_id)["queue.buffering.max.messages"])
        self.intake_limit = max(queue_limit - BATCH, queue_limit // 2)
        if self.owning:
            self._start_transactions()
        self.clients_open = True
        # Clusters are known by their Kafka cluster id (aliases are display names that may coincide).
        self.source_cluster = cluster_id(AdminClient(config.admin_settings("source")), "source", config.source_alias)
        self.destination_cluster = cluster_id(self._destination_admin(), "destination", config.target_alias)
        self.origin = self.source_cluster.encode()
        self.origin_header = (provenance.ORIGIN, self.origin)
        self.partitions = {}
        self.paused = {}
        self._start(owned)

    def _apply_assignment(self, mine: set[SourcePartition]) -> None:
        removed = [tp for tp in self.partitions if tp not in mine]
        if removed:
            # A partition moves only after everything read from it is acknowledged and committed.
            self._drain(30)
            self._commit()
            self.reader.unassign(removed)
            for tp in removed:
                del self.partitions[tp]
                self.paused.pop(tp, None)
            self.store.release_partitions(self.lease, removed)
            self.on_event(f"released {len(removed)} partition(s): {_fmt(removed)}")
        self.waiting = {tp for tp in mine if tp not in self.partitions}

    def _claim(self, wanted: list[SourcePartition]) -> None:
        stale = timedelta(milliseconds=self.config.lease_timeout_ms)
        claimed = self.store.claim_partitions_from(self.lease, wanted, stale)
        if self.transactions is not None:
            # Taken from a task that went silent without releasing them: its open transaction may hold their
            # records. Fencing its transactional.id aborts it before anything of ours is written or read.
            for silent in sorted({task for task in claimed.values() if task is not None}):
                fence(self.config.producer_settings(silent), COMMIT_WAIT_S)
                self.on_event(f"fenced silent task {silent}'s transactions before taking its partitions over")
        self.waiting.difference_update(claimed)
        self._start(sorted(claimed))

    def _start(self, partitions: list[SourcePartition]) -> None:
        """Begin consuming `partitions` at their committed offsets (or per auto.offset.reset)."""
        if not partitions:
            return
        stored = self.store.load_offsets(self.connector, partitions)
        if self.transactions is not None:
            self._resume_after_destination(partitions, stored)
        resets = self._reset_offsets([tp for tp in partitions if tp not in stored])
        assign = []
        for tp in partitions:
            destination = self.config.namer.destination_topic(tp[0])
            state = PartitionState(tp, stored.get(tp), destination, self.source_cluster)
            self.partitions[tp] = state
            assign.append(TopicPartition(tp[0], tp[1], stored[tp] if tp in stored else resets[tp]))
        self.reader.assign(assign)
        for topic in sorted({tp[0] for tp in partitions}):
            try:  # the topic's metadata now, in the consumers just given it, not at librdkafka's next topic scan
                self.reader.list_topics(topic, timeout=5)
            except Exception as exc:
                log.info("%s-%d: source metadata of %s not read: %s", self.connector, self.task_id, topic, exc)
        for topic in {self.partitions[tp].destination_topic for tp in partitions}:
            try:  # a destination topic grown a moment ago: the producer must know its new partitions
                self.producer.list_topics(topic, timeout=5)
            except KafkaException as exc:
                log.warning("destination metadata of %s unavailable: %s", topic, exc)
        self._check_destination(partitions)
        self.on_event(f"replicating {len(partitions)} partition(s): {_fmt(partitions)}")

    def _destination_layouts(self, topics: set[str]) -> dict[str, TopicPartitions]:
        return topic_partitions(self._destination_admin(), topics)

    def _destination_admin(self) -> AdminClient:
        """An admin client for one request: a long-lived one's background thread wakes 100 times a second (measured:
        0.5 % of a core, an idle task of 10,000 partitions held 4.3 % in all), and the task asks every few seconds."""
        return AdminClient(self.config.admin_settings("destination"))

    def _reset_offsets(self, partitions: list[SourcePartition]) -> dict[SourcePartition, int]:
        """Where partitions without a committed offset start, per `auto.offset.reset`: asked in one request per
        source broker; a partition whose answer failed gets the logical offset, which its consumer resolves."""
        latest = self.config.auto_offset_reset == "latest"
        logical = dict.fromkeys(partitions, OFFSET_END if latest else OFFSET_BEGINNING)
        if not partitions:
            return logical
        admin = AdminClient(self.config.admin_settings("source"))  # for one request, as `_destination_admin`
        return logical | log_offsets(admin, partitions, latest, self.config.exactly_once)

    def _resume_after_destination(self, partitions: list[SourcePartition], stored: dict[SourcePartition, int]) -> None:
        """Exactly-once: a partition resumes after its last committed copy at the destination when that is ahead
        of Postgres (the task stopped between a transaction's commit and the offsets' commit)."""
        ends = self.store.load_destination_offsets(self.connector, partitions)
        destinations = {tp: self.config.namer.destination_topic(tp[0]) for tp in partitions}
        layouts = self._destination_layouts(set(destinations.values()))
        points = {}
        for tp, destination in destinations.items():
            if tp[1] in layouts[destination].ids:
                points[tp] = ResumePoint(destination, tp[1], ends.get(tp))
        settings = self.config.admin_settings("destination")
        for tp, offset in resume_offsets(settings, self.source_cluster, points).items():
            if offset > stored.get(tp, 0):
                self.on_event(f"{tp[0]}[{tp[1]}] resumes at {offset} after its last copy at the destination "
                              f"(Postgres had {stored.get(tp)})")  # fmt: skip
                stored[tp] = offset

    # -- per-partition fault isolation ------------------------------------------------------------------

    def _check_destination(self, partitions: list[SourcePartition] | None = None) -> None:
        """Map each partition to its destination partition; pause those whose destination is missing."""
        states = [self.partitions[tp] for tp in partitions] if partitions else list(self.partitions.values())
        if not states:
            return
        try:
            layouts = self._destination_layouts({state.destination_topic for state in states})
        except Exception as exc:
            log.warning("destination metadata unavailable for %s-%d: %s", self.connector, self.task_id, exc)
            for state in states:
                if not state.routed and state.paused_reason is None:
                    # Its destination partition is unknown: producing now would let the partitioner scatter the
                    # partition's records over the destination's partitions, out of order. Wait and retry.
                    self._pause(state, f"destination metadata unavailable: {exc}")
            return
        self._map_destinations(states, layouts)

    def _map_destinations(self, states: list[PartitionState], layouts: dict[str, TopicPartitions]) -> None:
        for state in states:
            topic = layouts.get(state.destination_topic)
            if topic is None or topic.error is not None:
                if state.paused_reason is None:
                    why = f" ({topic.error})" if topic is not None and "nknown topic" not in topic.error else ""
                    self._pause(state, f"destination topic {state.destination_topic!r} does not exist{why}")
                continue
            if self.config.partition_matching is not False and state.partition in topic.ids:
                self._route(state, state.partition)
            elif self.config.requires_destination_partition:
                if state.paused_reason is None:
                    self._pause(state, f"destination partition {state.destination_topic}[{state.partition}] "
                                       "does not exist (partitions are preserved)")  # fmt: skip
            else:
                self._route(state, UNASSIGNED_PARTITION)

    def _route(self, state: PartitionState, partition: int) -> None:
        state.destination_partition = partition
        state.routed = True
        state.ordered = partition != UNASSIGNED_PARTITION and self.ordered_acks

    def _source_error(self, msg: Message) -> None:
        err: KafkaError = msg.error()
        if err.code() == KafkaError._PARTITION_EOF:
            return
        topic, partition = msg.topic(), msg.partition()
        if err.code() in SOURCE_GONE and topic:
            gone = [tp for tp in self.partitions if tp[0] == topic and (partition in (None, -1) or tp[1] == partition)]
            for tp in gone:
                self._drop(tp, f"source partition disappeared: {err.str()}")
            return
        if err.fatal():
            raise RuntimeError(f"source consumer failed: {err.str()}")
        log.warning("source error for %s-%d (%s[%s]): %s", self.connector, self.task_id, topic, partition, err.str())

    def _pause(self, state: PartitionState, reason: str) -> None:
        state.paused_reason = reason
        self.paused[state.tp] = state
        state.failures += 1
        state.retry_at = time.monotonic() + RETRY_BACKOFF_S[min(state.failures - 1, len(RETRY_BACKOFF_S) - 1)]
        self.reader.pause([state.tp])
        self._show_state(state, PartitionHealth.PAUSED, reason)
        self.on_event(f"paused {state.topic}[{state.partition}]: {reason}")

    def _resume(self, state: PartitionState) -> None:
        """Retry a paused partition from its first unacknowledged offset."""
        reason = state.paused_reason
        state.paused_reason = None
        del self.paused[state.tp]
        self._check_destination([state.tp])
        if state.paused_reason is not None:
            return  # still missing: _check_destination paused it again with a longer backoff
        restart = self._read_again(state)
        self.reader.resume([state.tp])
        self._show_state(state, PartitionHealth.ACTIVE, None)
        self.on_event(f"resumed {state.topic}[{state.partition}] at offset {restart} (was: {reason})")

    def _position(self, tp: SourcePartition) -> int | None:
        """The next offset of `tp` to read (None: nothing read or stored yet)."""
        return self.partitions[tp].position

    def _read_again(self, state: PartitionState) -> int | None:
        """Read a partition again from its first unacknowledged offset (returned): nothing produced is awaited."""
        restart = state.committable()
        state.forget_in_flight()
        state.position = restart
        if restart is not None:
            self.reader.seek(state.tp, restart)
        return restart

    def _show_state(self, state: PartitionState, shown: PartitionHealth, reason: str | None) -> None:
        """Record a pause or resume for operators; a database outage must not stop replication for it."""
        try:
            self.store.set_partition_state(self.lease, state.tp, shown, reason)
        except SQLAlchemyError as exc:
            log.warning("partition state of %s[%d] not recorded: %s", state.topic, state.partition, exc)

    def _drop(self, tp: SourcePartition, reason: str) -> None:
        self.reader.unassign([tp])
        self.partitions.pop(tp, None)
        self.paused.pop(tp, None)
        self.store.set_partition_state(self.lease, tp, PartitionHealth.DROPPED, reason)
        self.on_event(f"dropped {tp[0]}[{tp[1]}]: {reason}")

    def _start_transactions(self) -> None:
        """Exactly-once: `init_transactions` fences older instances of this task, then the first one begins."""
        self.transactions = None
        self.transaction_due, self.abort_reason = False, None
        if self.config.exactly_once:
            self.transactions = Transactions(self.producer, f"task {self.connector}-{self.task_id}")
            self.transactions.start(COMMIT_WAIT_S)

    def _replace_transactional_producer(self, reason: str) -> None:
        """Exactly-once: a new producer fences the failed one (its transaction is aborted); every partition rewinds."""
        self.on_event(f"transactional producer failed ({reason}); replacing it, every partition rewinds")
        self.aborting = True
        try:
            self.producer.purge()
            deadline = time.monotonic() + COMMIT_WAIT_S
            while len(self.producer) and time.monotonic() < deadline:
                self._serve(self.producer, 0.1)
        finally:
            self.aborting = False
        self.fatal_producer_error = None
        self.producer = Producer(self._producer_settings(self.config))
        self._start_transactions()
        self._rewind()

    def _recreate_producer(self) -> None:
        """An idempotent producer's fatal error ends that producer: start a new one, and read every partition the
        destination did not refuse again from its first unacknowledged record."""
        err, self.fatal_producer_error = self.fatal_producer_error, None
        assert err is not None
        if self.transactions is not None:
            if err.code() in FENCED_CODES:
                raise FencedError(f"the destination fenced this task's transactional producer ({err.name()})")
            self._replace_transactional_producer(f"{err.name()}: {err.str()}")
            return
        self.on_event(f"producer failed fatally ({err}); recreating it")
        producer = self.producer
        producer.purge()
        while len(producer):  # purged records come back (`_refused` leaves their partitions to the new producer)
            self._serve(producer, 0.1)
        self.fatal_producer_error = None  # this producer's own error again, if it is repeated while purging
        self._settle(delivered=False)
        self.producer = Producer(self._producer_settings(self.config))
        again = 0
        for state in self.partitions.values():
            if state.destination_partition != UNASSIGNED_PARTITION:
                self._route(state, state.destination_partition)
            # Partitions the destination did not refuse go on at once, from their first unacknowledged record;
            # a refused one waits for its backoff (`_resume`).
            if state.paused_reason is None or state.paused_reason is AWAITING_NEW_PRODUCER:
                state.paused_reason = None
                self._read_again(state)
                again += 1
        self.on_event(f"new producer: {again} partition(s) read again from their first unacknowledged offset")

    # -- metrics ----------------------------------------------------------------------------------------

    def _record_metrics(self) -> None:
        lags: dict[SourcePartition, int | None] = {}
        for state in self.partitions.values():
            _low, high = self.reader.watermarks(state.tp)
            done = state.committable()
            # Watermarks are only a hint (some brokers report them wrongly): never negative, unknown when absent.
            lags[state.tp] = max(high - done, 0) if high >= 0 and done is not None else None
        self.background.submit(self._store_metrics, self.metrics.drain(lags))

    def _store_metrics(self, interval: MetricInterval) -> None:
        try:
            self.store.record_metrics(self.connector, interval)
        except SQLAlchemyError as exc:
            log.warning("metrics of %s-%d not recorded: %s", self.connector, self.task_id, exc)

    def _producer_settings(self, config: ConnectorConfig) -> dict[str, Any]:
        return {
            **config.producer_settings(self.task_id),
            "error_cb": self._producer_error,
        }

    def _serve(self, producer: Producer, timeout: float) -> None:
        """Serve acknowledgements; a fatal producer error (raised by poll()) marks the producer for replacement."""
        try:
            producer.poll(timeout)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if not err.fatal():
                raise
            self.fatal_producer_error = self.fatal_producer_error or err

    def _producer_error(self, err: KafkaError) -> None:
        """librdkafka's error callback: without one, a fatal producer error is raised from poll()."""
        if err.fatal():
            self.fatal_producer_error = self.fatal_producer_error or err
        else:  # transient (a broker down, a connection reset): librdkafka retries by itself
            log.debug("producer of %s-%d: %s", self.connector, self.task_id, err.str())


def _fmt(partitions: list[SourcePartition], limit: int = 8) -> str:
    shown = ", ".join(f"{t}[{p}]" for t, p in partitions[:limit])
    return shown + (f" … (+{len(partitions) - limit})" if len(partitions) > limit else "")
