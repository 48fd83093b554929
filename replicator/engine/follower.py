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
from typing import NamedTuple

from confluent_kafka import KafkaException, TopicPartition
from sqlalchemy.exc import SQLAlchemyError

from replicator.assignment import SourcePartition
from replicator.engine.clients import Clients
from replicator.engine.committer import Committer
from replicator.engine.destinations import Destinations
from replicator.engine.partitions import PartitionBook, PartitionState, describe
from replicator.engine.pauses import PartitionPauses
from replicator.engine.record_limits import LIMITS_REFRESH_S, Readings, RecordLimits, read_limits
from replicator.engine.scheduler import READING_SIZE_LIMITS, REFRESHING, Scheduler
from replicator.engine.throttle import ThrottleShare
from replicator.state.records import ConnectorHead, ConnectorState, Lease, PartitionHealth
from replicator.state.store import Store

log = logging.getLogger(__name__)

# Pause, delete, restart, new config versions and assignment generations: one indexed row read this often, and
# seldom while Postgres's notices of a change are proven to arrive (`HeadNotices.heard`): a read is then a safety net.
REFRESH_INTERVAL_S = 0.5
HEARD_REFRESH_INTERVAL_S = 10.0


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


class AssignmentFollower:
    """The connector's row and the task's assignment, followed; paused partitions retried. It outlives the clients,
    says when the task must make them again (`Rebuild`), and uses the current ones and the committer made with them
    (`use`)."""

    def __init__(
        self,
        store: Store,
        lease: Callable[[], Lease],
        connector: str,
        task_id: int,
        *,
        book: PartitionBook,
        limits: RecordLimits,
        scheduler: Scheduler,
        background: ThreadPoolExecutor,
        head_changed: threading.Event,
        heard: Callable[[], bool],
        on_event: Callable[[str], None],
        pauses: PartitionPauses,
        destinations: Destinations,
        throttle: ThrottleShare,
    ) -> None:
        self.store = store
        self.lease = lease  # the task's, claimed after its parts are made (a warm standby's)
        self.connector = connector
        self.task_id = task_id
        self.book = book
        self.limits = limits  # the record size limits of the topics served
        self.scheduler = scheduler
        self.background = background  # the task's thread beside the loop: the connector's row is read there
        self.head_changed = head_changed  # Postgres said the connector's row changed: read it at the loop's next turn
        self.heard = heard  # whether Postgres's notices of a change are proven to arrive
        self.on_event = on_event
        self.pauses = pauses
        self.destinations = destinations
        self.throttle = throttle  # shared among the connector's tasks: made again when their number changes
        self.clients: Clients | None = None  # the current ones (`use`); None until the first are made
        self.committer: Committer  # made with them
        self.generation = 0
        self.tasks = 1  # in the connector's current assignment
        self.pauses_version = -1  # of the connector's operator pauses, as last read (`PartitionPauses.follow_pauses`)
        self.head_in_flight: Future[ConnectorHead | None] | None = None  # the connector's row, read in the background
        self.limits_in_flight: Future[Readings] | None = None
        self.unstarted: list[SourcePartition] = []  # claimed, then found to need new clients: started by the rebuild

    def use(self, clients: Clients, committer: Committer) -> None:
        """The clients `ReplicationTask.rebuild` made, and the committer made with them."""
        self.clients, self.committer = clients, committer

    def _in_use(self) -> Clients:
        assert self.clients is not None, "partitions are claimed, started and retried with clients made"
        return self.clients

    def tick(self, now: float) -> TaskExit | Rebuild | None:
        """The loop's duties here: act on the connector's row, check destinations, retry paused partitions."""
        # The connector's row is read off the loop (a query is milliseconds the records would wait) and acted on here.
        if self.head_in_flight is not None and self.head_in_flight.done():
            head_done, self.head_in_flight = self.head_in_flight, None
            try:
                outcome = self.refresh(head_done.result())
            except SQLAlchemyError as exc:  # the database is away: keep replicating, commits retry, so does this
                log.warning("reading the connector %s failed, will retry: %s", self.connector, exc)
                outcome = None
            if outcome is not None:
                return outcome
        scheduler = self.scheduler
        interval = HEARD_REFRESH_INTERVAL_S if self.heard() else REFRESH_INTERVAL_S
        if self.head_in_flight is None and (self.head_changed.is_set() or scheduler.due(REFRESHING, interval, now)):
            self.head_changed.clear()  # before the read: a change committed during it is read again
            scheduler.ran(REFRESHING, interval, now)
            self.head_in_flight = self.background.submit(self.store.connector_head, self.connector)
        self.destinations.tick(now)
        book, limits = self.book, self.limits
        if self.limits_in_flight is not None and self.limits_in_flight.done():
            limits_done, self.limits_in_flight = self.limits_in_flight, None
            if limits_done.exception() is None:
                if rebuild := self.limits_read(limits.apply(limits_done.result())):
                    return rebuild
            else:
                log.warning("size limits of %s-%d not read: %s", self.connector, self.task_id, limits_done.exception())
        if self.limits_in_flight is None and book.states and scheduler.due(READING_SIZE_LIMITS, LIMITS_REFRESH_S, now):
            source, destination = limits.served()
            self.limits_in_flight = self.background.submit(read_limits, self._in_use().config, source, destination)
        if book.paused and (due := book.due_for_retry(now)):
            return self.retry(due)
        return None

    # -- the connector and its assignment -------------------------------------------------------------------

    def refresh(self, head: ConnectorHead | None, force: bool = False) -> TaskExit | Rebuild | None:
        """Notice pause, delete, restart, new config versions and new assignment generations in the connector's
        row, as `Store.connector_head` read it."""
        if head is None:
            return TaskExit.DELETED
        if head.state == ConnectorState.PAUSED:
            return TaskExit.PAUSED
        clients = self.clients
        if clients is None or head.version != clients.version or head.restart_requested_at != clients.restart_marker:
            return Rebuild(head.version, head.restart_requested_at, head=head, force=force)
        store, connector = self.store, self.connector
        if force or head.pauses_version != self.pauses_version:  # before claims: a claimed partition starts held
            self.pauses.follow_pauses({tp: row.reason for tp, row in store.partition_pauses(connector).items()})
            self.pauses_version = head.pauses_version
        if force or head.assignment_generation != self.generation:
            self.generation = head.assignment_generation
            assignment = store.read_assignment(connector, self.generation)
            if self.generation > 0 and self.task_id not in assignment:
                return TaskExit.REMOVED
            if len(assignment) != self.tasks and assignment:
                self.tasks = len(assignment)
                self.throttle.share(clients.config, self.tasks)
            self.apply_assignment(set(assignment.get(self.task_id, ())))
        if self.book.waiting:
            return self.claim(sorted(self.book.waiting))
        return None

    def after_rebuild(self, rebuild: Rebuild) -> TaskExit | Rebuild | None:
        """The clients were made again: go on following the connector's row that asked for it, if one did."""
        return None if rebuild.head is None else self.refresh(rebuild.head, rebuild.force)

    def apply_assignment(self, mine: set[SourcePartition]) -> None:
        book = self.book
        removed = [tp for tp in book.states if tp not in mine]
        if removed:
            # A partition moves only after everything read from it is acknowledged and committed.
            clients = self._in_use()
            clients.deliveries.drain(30)
            self.committer.commit_now()
            clients.reader.unassign(removed)
            for tp in removed:
                book.remove(tp)
            self.store.release_partitions(self.lease(), removed)
            self.on_event(f"released {len(removed)} partition(s): {describe(removed)}")
        book.waiting = {tp for tp in mine if tp not in book.states}

    def claim(self, wanted: list[SourcePartition]) -> Rebuild | None:
        stale = timedelta(milliseconds=self._in_use().config.task_lease_timeout_ms)
        claimed = self.store.claim_partitions_from(self.lease(), wanted, stale)
        silent = {owner for owner in claimed.values() if owner is not None}
        if silent:
            self.committer.claimed_from(silent)
        self.book.waiting.difference_update(claimed)
        return self.start(sorted(claimed))

    def start(self, partitions: list[SourcePartition]) -> Rebuild | None:
        """Begin consuming `partitions` at their committed offsets (or per auto.offset.reset)."""
        partitions, self.unstarted = sorted({*partitions, *self.unstarted}), []
        if not partitions:
            return None
        clients, book, limits, committer = self._in_use(), self.book, self.limits, self.committer
        config = clients.config
        # New topics: their size limits are read first, and clients too small for them are made again (which
        # restarts the partitions already owned) before these start, by the rebuild.
        limits.serve(config, {topic for topic, _ in partitions})
        if any(limits.unread()) and (rebuild := self.limits_read(limits.learn(config))):
            self.unstarted = partitions
            return rebuild
        stored = self.store.load_offsets(self.connector, partitions)
        flowing = committer.find_copies(partitions, stored)
        resets = committer.reset_offsets([tp for tp in partitions if tp not in stored])
        assign = []
        for tp in partitions:
            destination = config.namer.destination_topic(tp[0])
            state = PartitionState(tp, stored.get(tp), destination, clients.source_cluster)
            if tp not in stored and resets[tp] >= 0:
                # Stored at the next commit: a restart before the partition's first record starts here too, instead
                # of asking auto.offset.reset again (at latest, what was written meanwhile would be skipped).
                state.starts_at(resets[tp])
            limits.fit(state, config)
            book.add(state)
            assign.append(TopicPartition(tp[0], tp[1], stored[tp] if tp in stored else resets[tp]))
        clients.reader.assign(assign, eager=flowing)  # each consumer reads its topics' metadata first
        self.destinations.check(partitions)  # routes each partition through its destination topic's producer
        for tp in partitions:
            if tp in self.pauses.held:
                self.pauses.hold(book.states[tp])
        for topic in {book.states[tp].destination_topic for tp in partitions}:
            if (producer := clients.deliveries.producer_of(topic)) is None:
                continue  # missing (its partitions are paused), or closed while idle: reopened with fresh metadata
            try:  # a destination topic grown a moment ago: its producer must know its new partitions
                producer.list_topics(topic, timeout=5)
            except KafkaException as exc:
                log.warning("destination metadata of %s unavailable: %s", topic, exc)
        self.on_event(f"replicating {len(partitions)} partition(s): {describe(partitions)}")
        return None

    # -- paused partitions --------------------------------------------------------------------------------

    def retry(self, due: list[PartitionState]) -> Rebuild | None:
        """Unpause the paused partitions whose backoff is over. The size limits of those refused for their size, and
        of destination topics not read yet (missing until now), are read first, in one request per cluster:
        clients that no longer fit are made again, which restarts every partition instead."""
        again = {state.destination_topic for state in due if state.recheck_limit}
        if again or any(self.limits.unread()):
            for state in due:
                state.limit_read()
            if rebuild := self.limits_read(self.limits.learn(self._in_use().config, again)):
                return rebuild
        for state in due:
            if state.refused_against is not None and state.refused_against == state.size_limit:
                # The record it waits with exceeds that same limit still: read again, it would be refused again (and
                # the partition shown replicating meanwhile). It waits for its next backoff, and a new reading.
                state.still_too_large()
                self.book.pause(state, state.paused_reason or "")
                continue
            state.within_limit()
            self.unpause(state)
        return None

    def limits_read(self, changed: set[str]) -> Rebuild | None:
        """Size limits were read (`changed`: destination topics whose limit changed). Clients made for other limits
        are made again, as for a new configuration version (records larger than their producer takes would be
        refused, batches larger than a destination topic takes would be refused by its broker): returned as a
        `Rebuild`; otherwise the partitions of `changed` are measured against their new limit."""
        self.scheduler.ran(READING_SIZE_LIMITS, LIMITS_REFRESH_S)
        clients, limits = self._in_use(), self.limits
        if limits.sizes_of(clients.config, self.task_id) != clients.sized_for:
            return Rebuild(clients.version, clients.restart_marker, why="the topics' record size limits changed")
        for state in self.book.states.values():
            if state.destination_topic in changed:
                limits.fit(state, clients.config)
        return None

    def unpause(self, state: PartitionState) -> None:
        """Read a paused partition again from its first unacknowledged offset, its backoff over."""
        reason = self.book.unpause(state)
        self.destinations.check([state.tp])
        if state.paused_reason is not None:
            return  # still missing: the check paused it again with a longer backoff
        restart = self.pauses.read_again(state)
        self._in_use().reader.resume([state.tp])
        self.pauses.show(state, PartitionHealth.ACTIVE, None)
        self.on_event(f"resumed {state.topic}[{state.partition}] at offset {restart} (was: {reason})")
