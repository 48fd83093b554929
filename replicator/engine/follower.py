"""Which partitions a task replicates: it follows the connector's row (pause, delete, restart, new configuration
versions and assignment generations) and its assignment, claims partitions from their last owner, starts each where
it resumes, and retries those paused after a failure once their backoff is over. Where each goes at the destination
is `replicator.engine.destinations`; pauses, holds and drops of one partition alone are `replicator.engine.pauses`."""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import NamedTuple, Protocol

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaException, TopicPartition
from sqlalchemy.exc import SQLAlchemyError

from replicator.assignment import SourcePartition
from replicator.clusters import ClusterAdmin, log_offsets
from replicator.configuration.connector import ConnectorConfig
from replicator.engine.deliveries import Deliveries
from replicator.engine.destinations import Destinations
from replicator.engine.partitions import PartitionBook, PartitionState, describe
from replicator.engine.pauses import PartitionPauses
from replicator.engine.record_limits import LIMITS_REFRESH_S, Readings, RecordLimits, read_limits
from replicator.engine.scheduler import READING_SIZE_LIMITS, REFRESHING, Scheduler
from replicator.engine.source_reader import SourceReader
from replicator.engine.throttle import ThrottleShare
from replicator.state.records import ConnectorHead, ConnectorState, Lease, PartitionHealth
from replicator.state.store import Store

log = logging.getLogger(__name__)

# Pause, delete, restart, new config versions and assignment generations: one indexed row read this often.
REFRESH_INTERVAL_S = 0.5


class Rebuild(NamedTuple):
    """The follower's answer when the task's clients must be made again (`ReplicationTask.rebuild`): for a new
    configuration version or restart (`why` None), or for record size limits the clients no longer fit. The task
    makes them, then lets the follower go on (`AssignmentFollower.after_rebuild`)."""

    version: int
    restart_marker: object
    why: str | None = None
    head: ConnectorHead | None = None  # the connector's row being followed when the rebuild was found needed
    force: bool = False


class TaskExit(enum.Enum):
    STOPPED = "STOPPED"  # asked to stop (run terminated, process shutting down)
    REMOVED = "REMOVED"  # the task is no longer part of the connector's assignment
    PAUSED = "PAUSED"  # the operator paused the connector
    DELETED = "DELETED"  # the connector was deleted
    FENCED = "FENCED"  # a newer instance of this task took over


class Committing(Protocol):
    """A committer (`replicator.engine.committer`), as the follower uses it."""

    def resume(self, partitions: list[SourcePartition], stored: dict[SourcePartition, int]) -> set[SourcePartition]: ...
    def claimed_from(self, silent_tasks: set[int]) -> None: ...
    def commit_now(self, final: bool = False) -> None: ...


class FollowedTask(Protocol):
    """What the follower reads of its task (`ReplicationTask`): it outlives the clients, says when the task must make
    them again (`Rebuild`), and uses the current ones, with the configuration and the committer made with them."""

    connector: str
    task_id: int
    store: Store
    lease: Lease
    config: ConnectorConfig
    source_cluster: str
    reader: SourceReader
    deliveries: Deliveries
    clients_open: bool
    version: int  # of the configuration the clients were made with
    restart_marker: object  # the connector's last restart request the clients were made after
    sized_for: tuple[object, ...]  # the size settings the clients were made with (`RecordLimits.sizes_of`)
    limits: RecordLimits  # the record size limits of the topics served
    book: PartitionBook
    scheduler: Scheduler
    background: ThreadPoolExecutor
    head_changed: threading.Event  # Postgres said the connector's row changed: read it at the loop's next turn
    on_event: Callable[[str], None]

    @property
    def committer(self) -> Committing: ...


class AssignmentFollower:
    """The connector's row and the task's assignment, followed; paused partitions retried."""

    def __init__(
        self, task: FollowedTask, pauses: PartitionPauses, destinations: Destinations, throttle: ThrottleShare
    ) -> None:
        self.task = task
        self.pauses = pauses
        self.destinations = destinations
        self.throttle = throttle  # shared among the connector's tasks: made again when their number changes
        self.generation = 0
        self.tasks = 1  # in the connector's current assignment
        self.pauses_version = -1  # of the connector's operator pauses, as last read (`PartitionPauses.follow_pauses`)
        self.head_in_flight: Future[ConnectorHead | None] | None = None  # the connector's row, read in the background
        self.limits_in_flight: Future[Readings] | None = None
        self.unstarted: list[SourcePartition] = []  # claimed, then found to need new clients: started by the rebuild

    def tick(self, now: float) -> TaskExit | Rebuild | None:
        """The loop's duties here: act on the connector's row, check destinations, retry paused partitions."""
        task = self.task
        # The connector's row is read off the loop (a query is milliseconds the records would wait) and acted on here.
        if self.head_in_flight is not None and self.head_in_flight.done():
            head_done, self.head_in_flight = self.head_in_flight, None
            try:
                outcome = self.refresh(head_done.result())
            except SQLAlchemyError as exc:  # the database is away: keep replicating, commits retry, so does this
                log.warning("reading the connector %s failed, will retry: %s", task.connector, exc)
                outcome = None
            if outcome is not None:
                return outcome
        if self.head_in_flight is None and (
            task.head_changed.is_set() or task.scheduler.due(REFRESHING, REFRESH_INTERVAL_S, now)
        ):
            task.head_changed.clear()  # before the read: a change committed during it is read again
            task.scheduler.ran(REFRESHING, REFRESH_INTERVAL_S, now)
            self.head_in_flight = task.background.submit(task.store.connector_head, task.connector)
        self.destinations.tick(now)
        states = task.book.states
        if self.limits_in_flight is not None and self.limits_in_flight.done():
            limits_done, self.limits_in_flight = self.limits_in_flight, None
            if limits_done.exception() is None:
                if rebuild := self.limits_read(task.limits.apply(limits_done.result())):
                    return rebuild
            else:
                log.warning("size limits of %s-%d not read: %s", task.connector, task.task_id, limits_done.exception())
        if self.limits_in_flight is None and states and task.scheduler.due(READING_SIZE_LIMITS, LIMITS_REFRESH_S, now):
            source, destination = task.limits.served()
            self.limits_in_flight = task.background.submit(read_limits, task.config, source, destination)
        if task.book.paused and (due := task.book.due_for_retry(now)):
            return self.retry(due)
        return None

    # -- the connector and its assignment -------------------------------------------------------------------

    def refresh(self, head: ConnectorHead | None, force: bool = False) -> TaskExit | Rebuild | None:
        """Notice pause, delete, restart, new config versions and new assignment generations in the connector's
        row, as `Store.connector_head` read it."""
        task = self.task
        if head is None:
            return TaskExit.DELETED
        if head.state == ConnectorState.PAUSED:
            return TaskExit.PAUSED
        if not task.clients_open or head.version != task.version or head.restart_requested_at != task.restart_marker:
            return Rebuild(head.version, head.restart_requested_at, head=head, force=force)
        if force or head.pauses_version != self.pauses_version:  # before claims: a claimed partition starts held
            self.pauses.follow_pauses(
                {tp: row.reason for tp, row in task.store.partition_pauses(task.connector).items()}
            )
            self.pauses_version = head.pauses_version
        if force or head.assignment_generation != self.generation:
            self.generation = head.assignment_generation
            assignment = task.store.read_assignment(task.connector, self.generation)
            if self.generation > 0 and task.task_id not in assignment:
                return TaskExit.REMOVED
            if len(assignment) != self.tasks and assignment:
                self.tasks = len(assignment)
                self.throttle.share(task.config, self.tasks)
            self.apply_assignment(set(assignment.get(task.task_id, ())))
        if task.book.waiting:
            return self.claim(sorted(task.book.waiting))
        return None

    def after_rebuild(self, rebuild: Rebuild) -> TaskExit | Rebuild | None:
        """The clients were made again: go on following the connector's row that asked for it, if one did."""
        return None if rebuild.head is None else self.refresh(rebuild.head, rebuild.force)

    def apply_assignment(self, mine: set[SourcePartition]) -> None:
        task, book = self.task, self.task.book
        removed = [tp for tp in book.states if tp not in mine]
        if removed:
            # A partition moves only after everything read from it is acknowledged and committed.
            task.deliveries.drain(30)
            task.committer.commit_now()
            task.reader.unassign(removed)
            for tp in removed:
                book.remove(tp)
            task.store.release_partitions(task.lease, removed)
            task.on_event(f"released {len(removed)} partition(s): {describe(removed)}")
        book.waiting = {tp for tp in mine if tp not in book.states}

    def claim(self, wanted: list[SourcePartition]) -> Rebuild | None:
        task = self.task
        stale = timedelta(milliseconds=task.config.task_lease_timeout_ms)
        claimed = task.store.claim_partitions_from(task.lease, wanted, stale)
        silent = {owner for owner in claimed.values() if owner is not None}
        if silent:
            task.committer.claimed_from(silent)
        task.book.waiting.difference_update(claimed)
        return self.start(sorted(claimed))

    def start(self, partitions: list[SourcePartition]) -> Rebuild | None:
        """Begin consuming `partitions` at their committed offsets (or per auto.offset.reset)."""
        partitions, self.unstarted = sorted({*partitions, *self.unstarted}), []
        if not partitions:
            return None
        task = self.task
        # New topics: their size limits are read first, and clients too small for them are made again (which
        # restarts the partitions already owned) before these start, by the rebuild.
        task.limits.serve(task.config, {topic for topic, _ in partitions})
        if any(task.limits.unread()) and (rebuild := self.limits_read(task.limits.learn(task.config))):
            self.unstarted = partitions
            return rebuild
        stored = task.store.load_offsets(task.connector, partitions)
        flowing = task.committer.resume(partitions, stored)
        resets = self.reset_offsets([tp for tp in partitions if tp not in stored])
        assign = []
        for tp in partitions:
            destination = task.config.namer.destination_topic(tp[0])
            state = PartitionState(tp, stored.get(tp), destination, task.source_cluster)
            if tp not in stored and resets[tp] >= 0:
                # Stored at the next commit: a restart before the partition's first record starts here too, instead
                # of asking auto.offset.reset again (at latest, what was written meanwhile would be skipped).
                state.starts_at(resets[tp])
            task.limits.fit(state, task.config)
            task.book.add(state)
            assign.append(TopicPartition(tp[0], tp[1], stored[tp] if tp in stored else resets[tp]))
        task.reader.assign(assign, eager=flowing)  # each consumer reads its topics' metadata first
        self.destinations.check(partitions)  # routes each partition through its destination topic's producer
        for tp in partitions:
            if tp in self.pauses.held:
                self.pauses.hold(task.book.states[tp])
        for topic in {task.book.states[tp].destination_topic for tp in partitions}:
            if (producer := task.deliveries.producer_of(topic)) is None:
                continue  # missing (its partitions are paused), or closed while idle: reopened with fresh metadata
            try:  # a destination topic grown a moment ago: its producer must know its new partitions
                producer.list_topics(topic, timeout=5)
            except KafkaException as exc:
                log.warning("destination metadata of %s unavailable: %s", topic, exc)
        task.on_event(f"replicating {len(partitions)} partition(s): {describe(partitions)}")
        return None

    def reset_offsets(self, partitions: list[SourcePartition]) -> dict[SourcePartition, int]:
        """Where partitions without a committed offset start, per `auto.offset.reset`: asked in one request per
        source broker; a partition whose answer failed gets the logical offset, which its consumer resolves.

        At `latest`, a partition added to a topic the connector already replicated starts at its beginning: it holds
        only records written since the connector began, which `latest` must not skip (docs/CONNECTOR-PROPERTIES.md)."""
        task = self.task
        config = task.config
        if not partitions:
            return {}
        added = set()
        if config.auto_offset_reset == "latest":
            added = task.store.partitions_added_later(task.connector, partitions)
        at_end = [tp for tp in partitions if config.auto_offset_reset == "latest" and tp not in added]
        at_beginning = [tp for tp in partitions if tp not in at_end]
        starts = dict.fromkeys(at_end, OFFSET_END) | dict.fromkeys(at_beginning, OFFSET_BEGINNING)
        admin = ClusterAdmin(config.admin_settings("source"))  # for one request, as `destination_admin`
        for wanted, latest in ((at_end, True), (at_beginning, False)):
            if wanted:
                starts |= log_offsets(admin, wanted, latest, config.exactly_once)
        if added:
            task.on_event(
                f"{describe(sorted(added))}: added to a topic already replicated, started at the beginning "
                "(auto.offset.reset=latest skips only what a topic contained before it was replicated)"
            )
        return starts

    # -- paused partitions --------------------------------------------------------------------------------

    def retry(self, due: list[PartitionState]) -> Rebuild | None:
        """Resume the paused partitions whose backoff is over. The size limits of those refused for their size, and
        of destination topics not read yet (missing until now), are read first, in one request per cluster:
        clients that no longer fit are made again, which restarts every partition instead."""
        task = self.task
        again = {state.destination_topic for state in due if state.recheck_limit}
        if again or any(task.limits.unread()):
            for state in due:
                state.limit_read()
            if rebuild := self.limits_read(task.limits.learn(task.config, again)):
                return rebuild
        for state in due:
            if state.refused_against is not None and state.refused_against == state.size_limit:
                # The record it waits with exceeds that same limit still: read again, it would be refused again (and
                # the partition shown replicating meanwhile). It waits for its next backoff, and a new reading.
                state.still_too_large()
                task.book.pause(state, state.paused_reason or "")
                continue
            state.within_limit()
            self.resume(state)
        return None

    def limits_read(self, changed: set[str]) -> Rebuild | None:
        """Size limits were read (`changed`: destination topics whose limit changed). Clients made for other limits
        are made again, as for a new configuration version (records larger than their producer takes would be
        refused, batches larger than a destination topic takes would be refused by its broker): returned as a
        `Rebuild`; otherwise the partitions of `changed` are measured against their new limit."""
        task = self.task
        task.scheduler.ran(READING_SIZE_LIMITS, LIMITS_REFRESH_S)
        if task.clients_open and task.limits.sizes_of(task.config, task.task_id) != task.sized_for:
            return Rebuild(task.version, task.restart_marker, why="the topics' record size limits changed")
        for state in task.book.states.values():
            if state.destination_topic in changed:
                task.limits.fit(state, task.config)
        return None

    def resume(self, state: PartitionState) -> None:
        """Retry a paused partition from its first unacknowledged offset."""
        reason = self.task.book.unpause(state)
        self.destinations.check([state.tp])
        if state.paused_reason is not None:
            return  # still missing: the check paused it again with a longer backoff
        restart = self.pauses.read_again(state)
        self.task.reader.resume([state.tp])
        self.pauses.show(state, PartitionHealth.ACTIVE, None)
        self.task.on_event(f"resumed {state.topic}[{state.partition}] at offset {restart} (was: {reason})")
