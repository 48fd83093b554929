"""What a task commits and when: each partition's next source offset, in Postgres under the lease epoch.

`Committer` is the at-least-once committer and the interface the task loop talks to; exactly-once mode's
`TransactionalCommitter` (`replicator.engine.transactions`) implements the same questions with a destination
transaction in front of each commit (as Kafka Connect's `WorkerSourceTask` and `ExactlyOnceWorkerSourceTask`
share `AbstractWorkerSourceTask`). The loop never asks which mode it runs in. Each mode also decides what the
refusals and the failed producer the deliveries kept do (`settle`, first of each `tick`), with
`replicator.engine.failures`.

At least once, a partition commits its first offset not yet acknowledged (`PartitionState.first_unacknowledged`):
acknowledgements advance each partition on their own, and every `offset.flush.interval.ms` one transaction writes
every partition that moved, with where its next copy goes at the destination, on a background thread — consumption
never waits for a commit. A crash re-sends what was copied after the last commit: a start finds those copies at
the destination and counts them, or skips them (`start.after.destination.copies`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaException
from sqlalchemy.exc import SQLAlchemyError

from replicator.assignment import SourcePartition
from replicator.clusters import ClusterAdmin, log_offsets
from replicator.engine.clients import Clients
from replicator.engine.destination_copies import DestinationReadError, SearchPoint, copies_end
from replicator.engine.destinations import Destinations
from replicator.engine.failures import DeliveryFailures
from replicator.engine.metrics import TaskMetrics
from replicator.engine.partitions import PartitionBook, PartitionState, describe
from replicator.engine.scheduler import COMMITTING, HEARTBEATING, Scheduler
from replicator.state.records import CopySegment, Lease
from replicator.state.store import Store

log = logging.getLogger(__name__)

COMMIT_WAIT_S = 30  # how long a commit that must come first (hand-over, shutdown) may wait for the background one
# While no batch was read and no run acknowledged (`PartitionBook.touched`), a commit is a heartbeat without visiting
# the partitions (a walk over thousands of them every second); still, every partition is looked at this often, for a
# change made elsewhere (a pause, a re-read) that moved a committable offset.
UNTOUCHED_RESCAN_S = 10.0
# At least once, a start that cannot read its copies at the destination within this long resumes at the committed
# offsets (re-sending, as without the read) rather than wait longer for a destination that may be down.
RESEND_SCAN_S = 10.0


class CommitWatchdogError(RuntimeError):
    """Records flowed but no offset commit succeeded for `commit.failure.restart.ms`."""


class Committer:
    skips_untouched = True  # whether an untouched book means no offset to commit moved (`commit_in_background`)

    def __init__(
        self,
        store: Store,
        lease: Callable[[], Lease],
        connector: str,
        task_id: int,
        *,
        book: PartitionBook,
        metrics: TaskMetrics,
        scheduler: Scheduler,
        background: ThreadPoolExecutor,
        on_event: Callable[[str], None],
        should_stop: Callable[[], bool],
        clients: Clients,
        destinations: Destinations,
        failures: DeliveryFailures,
    ) -> None:
        self.store = store
        self.lease = lease  # the task's, claimed after its committer is made (a warm standby's)
        self.connector = connector
        self.task_id = task_id
        self.book = book
        self.metrics = metrics
        self.scheduler = scheduler
        self.background = background  # the task's thread beside the loop: commits are written there
        self.on_event = on_event
        self.should_stop = should_stop  # the process or run is stopping: long waits of a start give up
        self.clients = clients  # made with it (`ReplicationTask.rebuild`)
        self.config = clients.config
        self.destinations = destinations  # where a start looks for the copies made since the last commit
        self.failures = failures  # what refusals and failed producers do to the partitions
        self.deliveries = clients.deliveries  # the producers, what they hold, and their failure
        self.lanes = clients.lanes  # copy.mode=batches: the segments of the batches copied, stored with each commit
        self.segments_in_flight = 0  # how many of them the background commit stores
        self.in_flight: tuple[Future[None], dict[SourcePartition, int]] | None = None  # the background commit
        self.started = 0.0  # when the background commit was sent
        self.uncommitted = False  # acknowledged progress that the last commit attempt could not store
        self.last_ok = time.monotonic()
        self.scanned: tuple[int, float] | None = None  # `PartitionBook.touched` and the time at the last scan

    def watch_on(self, last: Committer | None) -> None:
        """Take over the commit watchdog of the committer this one replaces, if any (`ReplicationTask.rebuild`): a new
        configuration version must not reset the time since the last successful commit."""
        if last is not None:
            self.uncommitted, self.last_ok = last.uncommitted, last.last_ok

    # -- what the task loop asks ------------------------------------------------------------------------------

    def start(self) -> None:
        """The task is owned now (claimed, or taken over by a warm standby)."""

    def accepting(self) -> bool:
        """Whether the loop may read more records now."""
        return True

    def ack_wait_s(self) -> float:
        """How long the loop waits for acknowledgements after a batch."""
        return 0.0

    def settle(self) -> None:
        """Decide what the refusals and the failed producer the deliveries kept do: at least once, a refused
        partition waits for its backoff and a failed producer is replaced (`replicator.engine.failures`)."""
        failures, deliveries = self.failures, self.deliveries
        for refusal in deliveries.take_refusals():
            failures.decide(refusal)
        if (failure := deliveries.take_failure()) is not None:
            failures.replace_producer(failure)
        elif deliveries.cut_runs and not len(deliveries):
            deliveries.conclude_cut_runs(delivered=True)

    def find_copies(
        self, partitions: list[SourcePartition], stored: dict[SourcePartition, int]
    ) -> set[SourcePartition]:
        """What the last owner of starting `partitions` copied after its last commit, found at the destination
        (`replicator.engine.destination_copies`; with the batch path, `replicator.batches.destination_batches`, which
        finds the copies of both paths): `stored`, the offsets in Postgres, is updated in place where a
        partition starts after those copies. Returns the partitions with copies (flowing when the last owner stopped:
        they start on eager fetching).

        At least once, a partition starts at its committed offset and so writes again what was copied after that
        commit (a crash's re-send): those copies are counted (`mirus_records_resent_total`), or with
        start.after.destination.copies skipped."""
        config = self.config
        if not config.ordered_acks:
            return set()  # a copy then says nothing of the records before it (and no destination offset is stored)
        kept = self.store.load_destination_offsets(self.connector, [tp for tp in partitions if tp in stored])
        if not kept:
            return set()  # a first start, or a connector committed before destination offsets were stored
        started = time.monotonic()
        try:
            points = self.search_points(list(kept), kept)
            # A partition whose destination log ends where its last commit left it (a clean stop) holds no copy to
            # find. One ListOffsets request per broker; where the answer is missing the partition is not read: a
            # re-send then goes uncounted, but nothing is skipped that is not known to be there.
            admin = self.destinations.admin()
            ends = log_offsets(admin, {(p.topic, p.partition) for p in points.values()}, latest=True)
            unknown = [tp for tp, p in points.items() if (p.topic, p.partition) not in ends]
            if unknown:
                self.on_event(
                    f"copies since the last commit not looked up for {len(unknown)} partition(s) (the destination "
                    f"gave no end offset): they resume at their committed offsets: {describe(unknown)}"
                )
            points = {tp: p for tp, p in points.items() if ends.get((p.topic, p.partition), 0) > (p.start or 0)}
            if not points:
                return set()
            self.on_event(f"looking up the last copies of {len(points)} partition(s) at the destination")
            settings, source_cluster = config.admin_settings("destination"), self.clients.source_cluster
            batch_copies: dict[SourcePartition, list[CopySegment]] = {}
            if self.lanes is None:
                found = copies_end(settings, source_cluster, points, RESEND_SCAN_S, self.should_stop)
            else:  # copies of both paths, interleaved: records by their headers, batches (no header) by their bytes
                found, batch_copies = self.lanes.copies_since(points, stored, ends)
        except (KafkaException, DestinationReadError) as exc:
            # The destination is down or refuses (its partitions wait for it anyway): resume as without the read.
            self.on_event(f"copies since the last commit not looked up ({exc}): resuming at the committed offsets")
            return set()
        ahead = {tp: offset - stored[tp] for tp, offset in found.items() if offset > stored[tp]}
        if not ahead:
            return set()
        records, took = sum(ahead.values()), f"found in {time.monotonic() - started:.2f}s"
        if config.start_after_destination_copies:
            skipped = {tp: found[tp] for tp in ahead}
            stored.update(skipped)
            self.on_event(
                f"resuming after {records} record(s) copied since the last commit, {took} at the destination: "
                f"{describe(ahead)}"
            )
            # Batch copies found are stored as segments (the copies' provenance) with where the next copy goes.
            segments = [s for tp in skipped for s in batch_copies.get(tp, [])]
            after = {(s.topic, s.partition): s.destination_start + s.count for s in segments}
            try:  # stored at once: a partition that stays idle would otherwise show its old offset until it moves
                self.store.commit(self.lease(), skipped, after, segments)
            except SQLAlchemyError as exc:
                log.warning("offsets of %s-%d after the copies not stored yet: %s", self.connector, self.task_id, exc)
            return set(ahead)
        for (topic, _), count in ahead.items():
            self.metrics.counters_for(topic).resent += count
        self.on_event(f"re-sending {records} record(s) copied since the last commit ({took}): {describe(ahead)}")
        return set(ahead)

    def reset_offsets(self, partitions: list[SourcePartition]) -> dict[SourcePartition, int]:
        """Where partitions without a committed offset start, per `auto.offset.reset`: asked in one request per
        source broker; a partition whose answer failed gets the logical offset, which its consumer resolves.

        At `latest`, a partition added to a topic the connector already replicated starts at its beginning: it holds
        only records written since the connector began, which `latest` must not skip (docs/CONNECTOR-PROPERTIES.md)."""
        config = self.config
        if not partitions:
            return {}
        added = set()
        if config.auto_offset_reset == "latest":
            added = self.store.partitions_added_later(self.connector, partitions)
        at_end = [tp for tp in partitions if config.auto_offset_reset == "latest" and tp not in added]
        at_beginning = [tp for tp in partitions if tp not in at_end]
        starts = dict.fromkeys(at_end, OFFSET_END) | dict.fromkeys(at_beginning, OFFSET_BEGINNING)
        admin = ClusterAdmin(config.admin_settings("source"))  # for one request, as `Destinations.admin`
        for wanted, latest in ((at_end, True), (at_beginning, False)):
            if wanted:
                starts |= log_offsets(admin, wanted, latest, config.exactly_once)
        if added:
            self.on_event(
                f"{describe(sorted(added))}: added to a topic already replicated, started at the beginning "
                "(auto.offset.reset=latest skips only what a topic contained before it was replicated)"
            )
        return starts

    def search_points(
        self, partitions: list[SourcePartition], kept: dict[SourcePartition, int]
    ) -> dict[SourcePartition, SearchPoint]:
        """Where each partition's copies are read from at the destination (`kept`: the destination offsets stored
        with the last commit), for those written to the destination partition with their number."""
        destinations = {tp: self.config.namer.destination_topic(tp[0]) for tp in partitions}
        layouts = self.destinations.layouts(set(destinations.values()))
        return {
            tp: SearchPoint(destination, tp[1], kept.get(tp))
            for tp, destination in destinations.items()
            if tp[1] in layouts[destination].ids
        }

    def claimed_from(self, silent_tasks: set[int]) -> None:
        """Partitions were taken over from these tasks, silent past their lease without releasing them."""

    def offset_of(self, state: PartitionState) -> int | None:
        """The offset to commit for `state`: everything before it is at the destination."""
        return state.first_unacknowledged()

    def destination_offsets(self, offsets: dict[SourcePartition, int]) -> dict[SourcePartition, int] | None:
        """Where the next copy of each of `offsets`' partitions goes at the destination (known where one
        acknowledgement stands for a run: `PartitionState.ordered`), so that a start reads from there."""
        states = self.book.states
        ends = {tp: states[tp].next_destination_offset for tp in offsets if tp in states}
        return {tp: end for tp, end in ends.items() if end is not None}

    # -- committing -------------------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """The loop's commit duties: collect the last background commit, send the next when due (or a heartbeat
        alone when commits are further apart than task.heartbeat.interval.ms), fail the task when none succeeds."""
        config, scheduler = self.config, self.scheduler
        self.settle()
        self.collect()
        if scheduler.due(COMMITTING, config.offset_flush_interval_ms / 1000, now):
            self.commit_due()
            if self.in_flight is None:
                self.commit_in_background()
            watchdog_s = config.commit_failure_restart_ms / 1000
            hanging = self.in_flight is not None and now - self.started > watchdog_s
            if (self.uncommitted or hanging) and now - self.last_ok > watchdog_s:
                raise CommitWatchdogError(
                    f"no offset commit succeeded for {now - self.last_ok:.0f}s while "
                    "records were being replicated (commit.failure.restart.ms)"
                )
        elif self.in_flight is None and scheduler.due(HEARTBEATING, config.task_heartbeat_interval_ms / 1000, now):
            # A heartbeat alone keeps a standby from taking a live task over once task.lease.timeout.ms has passed.
            self.started = now
            self.in_flight = (self.background.submit(self.store.commit, self.lease(), {}), {})
            self.segments_in_flight = 0
        self.after_tick()

    def commit_due(self) -> None:
        """The commit interval has passed."""

    def after_tick(self) -> None:
        """Whatever the mode does after the loop's commit duties."""

    def commit_now(self, final: bool = False) -> None:
        """Commit in this thread (a final commit, or before partitions change hands)."""
        self.collect(wait=True)  # never let an older commit land after this one
        self.before_commit_now(final)
        offsets = self.book.changed(self.offset_of)
        segments = list(self.lanes.segments) if self.lanes is not None else []
        try:
            self.store.commit(self.lease(), offsets, self.destination_offsets(offsets), segments)
        except SQLAlchemyError as exc:
            if final:
                raise
            self._failed(offsets, exc)
            return
        self._succeeded(offsets, len(segments))

    def before_commit_now(self, final: bool) -> None:
        """What must be durable at the destination before a commit in this thread."""

    def commit_in_background(self) -> None:
        now = time.monotonic()
        touched = self.book.touched
        if self.scanned is not None and self.scanned[0] == touched and now - self.scanned[1] < UNTOUCHED_RESCAN_S:
            offsets = {}
        else:
            offsets = self.book.changed(self.offset_of)
            self.scanned = (touched, now) if self.skips_untouched else None
        segments = list(self.lanes.segments) if self.lanes is not None else []
        heartbeat_s = self.config.task_heartbeat_interval_ms / 1000
        if not offsets and not segments and not self.scheduler.due(HEARTBEATING, heartbeat_s, now):
            return  # nothing to store: an idle task writes its heartbeat alone, when due (a transaction each)
        self.started = now
        self.scheduler.ran(HEARTBEATING, heartbeat_s, self.started)
        future = self.background.submit(
            self.store.commit, self.lease(), offsets, self.destination_offsets(offsets), segments
        )
        self.in_flight = (future, offsets)
        self.segments_in_flight = len(segments)

    def collect(self, wait: bool = False) -> None:
        """Apply the outcome of the background commit once it is done (raises FencedError if it was fenced)."""
        if self.in_flight is None or not (wait or self.in_flight[0].done()):
            return
        (future, offsets), self.in_flight = self.in_flight, None
        try:
            future.result(timeout=COMMIT_WAIT_S)
        except TimeoutError:
            log.warning("offset commit of %s-%d still running after %ss", self.connector, self.task_id, COMMIT_WAIT_S)
            self.uncommitted = bool(offsets)
            return
        except SQLAlchemyError as exc:
            self._failed(offsets, exc)
            return
        self._succeeded(offsets, self.segments_in_flight)

    def _succeeded(self, offsets: dict[SourcePartition, int], segments: int = 0) -> None:
        if self.lanes is not None:
            self.lanes.committed_segments(segments)
        self.book.committed(offsets)
        self.last_ok = time.monotonic()
        self.uncommitted = False

    def _failed(self, offsets: dict[SourcePartition, int], exc: SQLAlchemyError) -> None:
        self.scanned = None  # the next commit looks at every partition again
        log.warning("offset commit of %s-%d failed, will retry: %s", self.connector, self.task_id, exc)
        self.uncommitted = bool(offsets)
