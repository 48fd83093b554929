"""The batch path (`copy.mode=batches`): partitions whose record batches can pass are copied as bytes by
`replicator.batches` (fetched, their headers rewritten to this task's producer id and sequences, produced), beside
the record path, which copies everything else through the source reader and the deliveries.

Every partition starts on the record path, as it always did, and moves to a lane of the batch copier once the record
path holds nothing of it (no run in flight, no refusal) and its destination partition (the same number) and size
limit are known (`take_ready`, once a second); it leaves the source reader then, so its records come by one path
alone. A batch that cannot pass (gaps, too large, not magic 2, a start inside it) is handed back: the partition
returns to the source reader at that batch's first offset, and to a lane once the record path copied past the
batch's end and holds nothing of it again, so the destination gets every record once and in order whichever path
wrote it. A topic that keeps append times stays on the record path once its first batch is seen (every batch of it
would come back). A problem the copier cannot retry, a pause or a hold give the partition back to the record path
too, whose decisions (pauses, backoffs, replaced producers) then apply unchanged; a producer the destination no
longer knows (a lost or outdated producer id or sequence) is replaced by a new one for every lane.

The ledger (`PartitionState`) holds both paths' progress: a lane's copies are acknowledged when its step returns, so
a committed offset covers them as the record path's acknowledgements do. Their provenance lives in Postgres, not in
headers: each copied run's segment (source offset, destination offset, count) goes with the next offset commit
(`segments`, `Committer`), and the batch producer's id is recorded for the destination cluster before it writes;
a batch whose producer id the platform recorded for the source cluster is a copy, and is skipped (the cycle guard).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping

from confluent_kafka import TopicPartition
from sqlalchemy.exc import SQLAlchemyError

from replicator.assignment import SourcePartition
from replicator.batches.copier import UNKNOWN_OFFSET, BatchCopier, Step
from replicator.batches.destination_batches import BatchReadError, copies_since
from replicator.batches.record_batch import Reason
from replicator.batches.wire import BrokerError, KafkaWire, Partition, UnsupportedSettingError
from replicator.configuration.connector import ConnectorConfig
from replicator.engine.destination_copies import DestinationReadError, SearchPoint
from replicator.engine.metrics import PAUSED, PROBLEM, TaskMetrics
from replicator.engine.partitions import PartitionBook, PartitionState
from replicator.engine.source_reader import SourceReader
from replicator.state.records import CopySegment, Lease
from replicator.state.store import Store

log = logging.getLogger(__name__)

TAKE_READY_S = 1.0  # how often the record path's partitions are looked at for lanes
GIVEN_BACK_S = 10.0  # a partition given back for a problem stays on the record path at least this long
MAX_WAIT_MS = 100  # a fetch with nothing to copy is answered after this long: the loop's other duties wait no more
# ... while the record path holds partitions too. With every partition on a lane, a fetch waits this long at its
# broker (answered at its first record, as a consumer's is), and a step waits for its answer LANES_ALONE_STEP_MS
# at most, then lets the loop turn and waits for the same fetch again. Kafka 1.0 has no fetch sessions: each fetch
# names every lane's partition, and an idle task of 5,000 partitions spent 29 % of a core on fetches that found
# nothing at 100 ms, and 10 % at 500 ms.
LANES_ALONE_WAIT_MS = 5_000
LANES_ALONE_STEP_MS = 500
FETCH_MAX_BYTES = 16 * 1024 * 1024
# The destination no longer accepts the producer's identity or sequence: a new producer id, every lane again.
PRODUCER_LOST = {45, 47, 59}  # OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH, UNKNOWN_PRODUCER_ID


class Provenance:
    """The producer ids this platform's flows write with, in Postgres: the batch producer's recorded for the
    destination cluster, and those recorded for the source cluster asked (`ours`), read again for an id not seen."""

    def __init__(self, store: Store, lease: Callable[[], Lease], source_cluster: str, destination_cluster: str) -> None:
        self.store = store
        self.lease = lease  # (the task's, claimed after its clients may have been made: a standby's)
        self.source_cluster = source_cluster
        self.destination_cluster = destination_cluster
        self.platform: set[int] = set()
        self.others: set[int] = set()  # ids read again and found not to be the platform's

    def record(self, producer_id: int) -> None:
        self.store.record_producer_id(self.lease(), self.destination_cluster, producer_id)

    def at_destination(self) -> set[int]:
        """The producer ids this platform's flows write the destination cluster with."""
        return self.store.platform_producer_ids(self.destination_cluster)

    def ours(self, producer_id: int) -> bool:
        if producer_id in self.platform:
            return True
        if producer_id in self.others:
            return False
        self.platform = self.store.platform_producer_ids(self.source_cluster)
        if producer_id not in self.platform:
            self.others.add(producer_id)
        return producer_id in self.platform


class BatchLanes:
    """The task's partitions on the batch path, and their moves between the two paths (see the module)."""

    def __init__(self, copier: BatchCopier, book: PartitionBook, reader: SourceReader, metrics: TaskMetrics,
                 on_event: Callable[[str], None], provenance: Provenance) -> None:  # fmt: skip
        self.copier = copier
        self.provenance = provenance
        self.recorded: int | None = None  # the producer id recorded for the destination cluster
        self.segments: list[CopySegment] = []  # copied since the last offset commit that stored them
        self.book = book
        self.reader = reader
        self.metrics = metrics
        self.on_event = on_event
        self.lanes: dict[SourcePartition, PartitionState] = {}
        self.records_until: dict[SourcePartition, int] = {}  # handed back: the record path copies up to here
        self.not_before: dict[SourcePartition, float] = {}
        self.high_watermarks: dict[SourcePartition, int] = {}
        self.told: set[tuple[SourcePartition, str]] = set()  # hand-backs an event said, by partition and reason
        self.taken_at = 0.0
        self.removals = book.removals

    @classmethod
    def open(
        cls,
        config: ConnectorConfig,
        book: PartitionBook,
        reader: SourceReader,
        metrics: TaskMetrics,
        on_event: Callable[[str], None],
        provenance: Provenance,
    ) -> BatchLanes | None:
        """The lanes of a connector that copies batches, connected to both clusters; None (every partition on the
        record path, with an event saying why) when they cannot be."""
        try:
            source = KafkaWire(config.admin_settings("source"), fetch_max_bytes=FETCH_MAX_BYTES)
        except (UnsupportedSettingError, BrokerError, OSError) as exc:
            on_event(f"copy.mode=batches: the source cannot be read as batches ({exc}); the record path copies all")
            return None
        try:
            destination = KafkaWire(config.admin_settings("destination"), fetch_max_bytes=1024 * 1024)
            copier = BatchCopier(source, destination, max_wait_ms=MAX_WAIT_MS, ours=provenance.ours)
        except (UnsupportedSettingError, BrokerError, OSError) as exc:
            source.close()
            on_event(f"copy.mode=batches: the destination takes no batches ({exc}); the record path copies all")
            return None
        return cls(copier, book, reader, metrics, on_event, provenance)

    def close(self) -> None:
        self.copier.close()
        self.copier.source.close()
        self.copier.destination.close()

    def committed_segments(self, count: int) -> None:
        """The first `count` segments are stored (with an offset commit)."""
        del self.segments[:count]

    def copies_since(
        self,
        points: Mapping[SourcePartition, SearchPoint],
        stored: Mapping[SourcePartition, int],
        ends: Mapping[tuple[str, int], int],
    ) -> tuple[dict[SourcePartition, int], dict[SourcePartition, list[CopySegment]]]:
        """Per partition, the source offset after the last copy made after the last commit (from `stored` at the
        source, from its point up to its partition's end in `ends` at the destination), by either path, and the
        batch copies among them (`replicator.batches.destination_batches`; DestinationReadError when a partition
        cannot be read)."""
        producers, source_cluster = self.provenance.at_destination(), self.provenance.source_cluster
        found, batch_copies = {}, {}
        for tp, point in points.items():
            end = ends.get((point.topic, point.partition))
            if point.start is None or end is None:
                continue
            try:
                copies = copies_since(
                    self.copier.source, self.copier.destination, Partition(*tp), stored[tp],
                    Partition(point.topic, point.partition), point.start, end,
                    source_cluster, producers, self.provenance.ours,
                )  # fmt: skip
            except BatchReadError as exc:
                raise DestinationReadError(f"reading the destination to resume: {exc}") from exc
            found[tp] = copies.end
            if copies.segments:
                batch_copies[tp] = [
                    CopySegment(tp[0], tp[1], s.source_offset, point.topic, point.partition, s.destination_offset,
                                s.count)
                    for s in copies.segments
                ]  # fmt: skip
        return found, batch_copies

    def watermarks(self, tp: SourcePartition) -> tuple[int, int]:
        """The partition's high watermark as a lane's last fetch answered (the reader's, off the lanes)."""
        if tp in self.lanes:
            return -1, self.high_watermarks.get(tp, -1)
        return self.reader.watermarks(tp)

    # -- the loop's turn ---------------------------------------------------------------------------------------

    def step(self, now: float) -> bool:
        """Move partitions between the paths as needed, then copy every lane's batches once. Whether the lanes
        fetched (a step waits for a fetch's answer MAX_WAIT_MS at most, or LANES_ALONE_STEP_MS)."""
        if self.book.removals != self.removals:  # released, dropped, or made again: their lanes end
            self.removals = self.book.removals
            for tp in [tp for tp, state in self.lanes.items() if self.book.states.get(tp) is not state]:
                self.copier.stop(Partition(*tp))
                del self.lanes[tp]
        for tp in [tp for tp in self.book.paused if tp in self.lanes]:
            self._give_back(self.lanes[tp], PAUSED, "paused")
        # Read before partitions move: the step that takes the record path's last ones still waits MAX_WAIT_MS, so
        # the loop's first duties after a move (a start's first commit among them) come as soon as they did before.
        alone = not self.reader.holds_partitions()
        self.copier.max_wait_ms = LANES_ALONE_WAIT_MS if alone else MAX_WAIT_MS
        self.copier.step_wait_ms = LANES_ALONE_STEP_MS if alone else MAX_WAIT_MS
        # Not while a fetch waits longer: a new lane joins the next fetch, and its records would wait for that one.
        if now - self.taken_at >= TAKE_READY_S and self.copier.waiting_ms() <= MAX_WAIT_MS:
            self.taken_at = now
            self.take_ready(now)
        if not self.lanes:
            return False
        try:
            if self.recorded != self.copier.producer.producer_id:
                # Recorded before it writes anything: a flow reading the destination skips its batches from the start.
                self.provenance.record(self.copier.producer.producer_id)
                self.recorded = self.copier.producer.producer_id
            step = self.copier.step()  # (asks Postgres whose a batch's producer id is, for an id not seen)
        except SQLAlchemyError as exc:
            # Without Postgres a copy cannot be told from a record: nothing is copied until it answers again.
            log.warning("copy.mode=batches: waiting for the platform database: %s", exc)
            return False
        self._settle(step, now)
        return True

    def take_ready(self, now: float) -> None:
        """Partitions the record path holds nothing of, whose destination partition and size limit are known."""
        taken = []
        for tp, state in self.book.states.items():
            if tp in self.lanes or not _ready(state) or now < self.not_before.get(tp, 0.0):
                continue
            assert state.next_offset is not None and state.size_limit is not None  # (`_ready`)
            until = self.records_until.get(tp)
            if until is not None and state.next_offset < until:
                continue  # the record path has not copied past the batch it was handed yet
            try:
                self.copier.start(Partition(*tp), state.next_offset, state.destination_topic, state.size_limit.bytes)
            except ValueError:  # another source partition's lane writes that destination partition
                self.not_before[tp] = now + GIVEN_BACK_S
                continue
            self.records_until.pop(tp, None)
            self.lanes[tp] = state
            taken.append(tp)
        if taken:
            self.reader.unassign(taken)
            self.on_event(f"copy.mode=batches: {len(taken)} partition(s) copied as batches")

    def _settle(self, step: Step, now: float) -> None:
        acknowledged_ms = time.time_ns() // 1_000_000
        for source, segments in step.segments.items():
            state = self.lanes[(source.topic, source.partition)]
            self.segments += [
                CopySegment(source.topic, source.partition, s.source_offset, state.destination_topic, source.partition,
                            s.destination_offset, s.count)
                for s in segments
                if s.destination_offset != UNKNOWN_OFFSET
            ]  # fmt: skip
            last = segments[-1]
            after = last.destination_offset + last.count if last.destination_offset != UNKNOWN_OFFSET else None
            state.copied_as_batches(max(state.next_offset or 0, last.source_offset + last.count), after)
            counters = self.metrics.counters_for(source.topic)
            counters.add_batches(sum(s.count for s in segments), step.bytes_copied.get(source, 0))
            # A batch's records are not decoded: each counts at its batch's timestamp (`RecordBatch.timestamp`).
            counters.add_batch_latencies(acknowledged_ms, step.timestamps.get(source, ()))
        for source, position in step.positions.items():  # past control batches and aborted transactions too
            state = self.lanes[(source.topic, source.partition)]
            if state.next_offset is None or position > state.next_offset:
                state.copied_as_batches(position, None)
        if step.segments:
            self.book.touched += 1
        # (A `Partition` is the tuple of its topic and number.)
        self.high_watermarks.update(step.high_watermarks.items())
        for source, hand_back in step.handed_back.items():
            tp = (source.topic, source.partition)
            self.records_until[tp] = hand_back.batch.next_offset
            if hand_back.reason is Reason.APPEND_TIME:  # every batch of the topic: records for the task's life
                self.not_before[tp] = math.inf
            said = (tp, hand_back.reason.value)
            why = None if said in self.told else f"a batch {hand_back.reason.value}"
            self.told.add(said)  # once a partition and reason: a compacted topic hands every batch back
            self._give_back(self.lanes[tp], hand_back.reason.name.lower(), why, hand_back.offset)
        lost = False
        for source, problem in step.problems.items():
            tp = (source.topic, source.partition)
            if problem.code in PRODUCER_LOST:
                lost = True
            elif not problem.retriable and tp in self.lanes:  # the record path meets it, and decides as it does
                self.not_before[tp] = now + GIVEN_BACK_S
                self._give_back(self.lanes[tp], PROBLEM, f"{problem.name} ({problem.code})")
        if lost:
            self._new_producer(step)

    def _new_producer(self, step: Step) -> None:
        """The destination lost this producer's identity or sequence: every lane goes on with a new producer id."""
        names = sorted({p.name for p in step.problems.values() if p.code in PRODUCER_LOST})
        self.on_event(f"copy.mode=batches: the destination refused the batch producer ({', '.join(names)}); a new one")
        old = self.copier
        old.close()
        self.copier = BatchCopier(old.source, old.destination, max_wait_ms=MAX_WAIT_MS, ours=self.provenance.ours)
        for tp, state in self.lanes.items():
            assert state.next_offset is not None and state.size_limit is not None
            self.copier.start(Partition(*tp), state.next_offset, state.destination_topic, state.size_limit.bytes)

    def _give_back(self, state: PartitionState, reason: str, why: str | None, offset: int | None = None) -> None:
        """The record path copies `state` again, from `offset` (its next offset by default); counted by `reason`
        (one of HAND_BACK_REASONS), said in an event when `why` is given."""
        tp = state.tp
        self.metrics.counters_for(tp[0]).hand_back(reason)
        self.copier.stop(Partition(*tp))
        del self.lanes[tp]
        start = state.next_offset if offset is None else offset
        assert start is not None
        self.reader.assign([TopicPartition(tp[0], tp[1], start)])
        if tp in self.reader.paused or state.paused_reason is not None:
            self.reader.pause([tp])
        if why is not None:
            self.on_event(f"{tp[0]}[{tp[1]}] back on the record path at offset {start}: {why}")


def _ready(state: PartitionState) -> bool:
    """Whether the record path holds nothing of the partition and its lane's destination is known."""
    return (
        state.routed
        and state.destination_partition == state.partition
        and state.paused_reason is None
        and not state.pending
        and state.in_flight == 0
        and state.refused_from is None
        and state.next_offset is not None
        and state.next_offset >= 0
        and state.size_limit is not None
    )
