"""Which partitions a task replicates, and where to: it follows the connector's row (pause, delete, restart, new
configuration versions and assignment generations) and its assignment, claims partitions from their last owner,
starts each where it resumes, routes it to its destination partition, and pauses, resumes or drops one alone —
after a failure, or by an operator's hand (`partition_pauses`, kept until an operator resumes the partition)."""

from __future__ import annotations

import enum
import logging
import math
from concurrent.futures import Future
from datetime import timedelta
from typing import Literal

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient
from sqlalchemy.exc import SQLAlchemyError

from replicator.assignment import SourcePartition
from replicator.clusters import ClusterAdmin, TopicPartitions, connection_identity, log_offsets, topic_partitions
from replicator.engine.context import TaskContext
from replicator.engine.partitions import UNASSIGNED_PARTITION, PartitionState, describe
from replicator.engine.record_limits import LIMITS_REFRESH_S, Readings, read_limits
from replicator.engine.scheduler import CHECKING_DESTINATIONS, READING_SIZE_LIMITS, REFRESHING
from replicator.state.records import OPERATOR_PAUSE, ConnectorHead, ConnectorState, PartitionHealth

log = logging.getLogger(__name__)

# Pause, delete, restart, new config versions and assignment generations: one indexed row read this often.
REFRESH_INTERVAL_S = 0.5
DESTINATION_CHECK_INTERVAL_S = 5.0  # route or pause partitions by destination metadata ...
# ... per this many destination partitions: librdkafka's answer, turned into Python objects, costs ~17-20 us of CPU per
# partition (10,000: ~190 ms), so a task of 10,000 partitions checks every 50 s, at under 0.5 % of a core.
DESTINATION_CHECK_PARTITIONS = 1_000
SOURCE_GONE = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}


class TaskExit(enum.Enum):
    STOPPED = "STOPPED"  # asked to stop (run terminated, process shutting down)
    REMOVED = "REMOVED"  # the task is no longer part of the connector's assignment
    PAUSED = "PAUSED"  # the operator paused the connector
    DELETED = "DELETED"  # the connector was deleted
    FENCED = "FENCED"  # a newer instance of this task took over


class AssignmentFollower:
    def __init__(self, task: TaskContext) -> None:
        self.task = task
        self.generation = 0
        self.tasks = 1  # in the connector's current assignment
        self.pauses_version = -1  # of the connector's operator pauses, as last read (`follow_pauses`)
        self.held: dict[SourcePartition, str] = {}  # partitions an operator paused, owned or not -> the reason
        self.head_in_flight: Future[ConnectorHead | None] | None = None  # the connector's row, read in the background
        self.metadata_in_flight: Future[dict[str, TopicPartitions]] | None = None
        self.limits_in_flight: Future[Readings] | None = None

    def tick(self, now: float) -> TaskExit | None:
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
        if self.metadata_in_flight is not None and self.metadata_in_flight.done():
            layouts_done, self.metadata_in_flight = self.metadata_in_flight, None
            if layouts_done.exception() is None:
                self.map_destinations(list(task.book.states.values()), layouts_done.result())
            else:
                log.warning(
                    "destination metadata unavailable for %s-%d: %s",
                    task.connector,
                    task.task_id,
                    layouts_done.exception(),
                )
        states = task.book.states
        if (
            self.metadata_in_flight is None
            and states
            and task.scheduler.due(
                CHECKING_DESTINATIONS,
                DESTINATION_CHECK_INTERVAL_S * max(1.0, len(states) / DESTINATION_CHECK_PARTITIONS),
                now,
            )
        ):
            topics = {state.destination_topic for state in states.values()}
            self.metadata_in_flight = task.background.submit(self.destination_layouts, topics)
        if self.limits_in_flight is not None and self.limits_in_flight.done():
            limits_done, self.limits_in_flight = self.limits_in_flight, None
            if limits_done.exception() is None:
                self.limits_read(task.limits.apply(limits_done.result()))
            else:
                log.warning("size limits of %s-%d not read: %s", task.connector, task.task_id, limits_done.exception())
        if self.limits_in_flight is None and states and task.scheduler.due(READING_SIZE_LIMITS, LIMITS_REFRESH_S, now):
            source, destination = task.limits.served()
            self.limits_in_flight = task.background.submit(read_limits, task.config, source, destination)
        if task.book.paused and (due := task.book.due_for_retry(now)):
            self.retry(due)
        return None

    # -- the connector and its assignment -------------------------------------------------------------------

    def refresh(self, head: ConnectorHead | None, force: bool = False) -> TaskExit | None:
        """Notice pause, delete, restart, new config versions and new assignment generations in the connector's
        row, as `Store.connector_head` read it."""
        task = self.task
        if head is None:
            return TaskExit.DELETED
        if head.state == ConnectorState.PAUSED:
            return TaskExit.PAUSED
        if not task.clients_open or head.version != task.version or head.restart_requested_at != task.restart_marker:
            task.rebuild(head.version, head.restart_requested_at)
        if force or head.pauses_version != self.pauses_version:  # before claims: a claimed partition starts held
            self.follow_pauses({tp: row.reason for tp, row in task.store.partition_pauses(task.connector).items()})
            self.pauses_version = head.pauses_version
        if force or head.assignment_generation != self.generation:
            self.generation = head.assignment_generation
            assignment = task.store.read_assignment(task.connector, self.generation)
            if self.generation > 0 and task.task_id not in assignment:
                return TaskExit.REMOVED
            if len(assignment) != self.tasks and assignment:
                self.tasks = len(assignment)
                task.forwarder.rethrottle(task.config, self.tasks)
            self.apply_assignment(set(assignment.get(task.task_id, ())))
        if task.book.waiting:
            self.claim(sorted(task.book.waiting))
        return None

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

    def claim(self, wanted: list[SourcePartition]) -> None:
        task = self.task
        stale = timedelta(milliseconds=task.config.lease_timeout_ms)
        claimed = task.store.claim_partitions_from(task.lease, wanted, stale)
        silent = {owner for owner in claimed.values() if owner is not None}
        if silent:
            task.committer.claimed_from(silent)
        task.book.waiting.difference_update(claimed)
        self.start(sorted(claimed))

    def start(self, partitions: list[SourcePartition]) -> None:
        """Begin consuming `partitions` at their committed offsets (or per auto.offset.reset)."""
        if not partitions:
            return
        task = self.task
        # New topics: their size limits are read first, and clients too small for them are made again (which
        # restarts the partitions already owned) before these start.
        task.limits.serve(task.config, {topic for topic, _ in partitions})
        if any(task.limits.unread()):
            self.limits_read(task.limits.learn(task.config))
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
                state.position = state.durable = resets[tp]
            task.limits.fit(state, task.config)
            task.book.add(state)
            assign.append(TopicPartition(tp[0], tp[1], stored[tp] if tp in stored else resets[tp]))
        task.reader.assign(assign, eager=flowing)  # each consumer reads its topics' metadata first
        self.check_destination(partitions)  # routes each partition through its destination topic's producer
        for tp in partitions:
            if tp in self.held:
                self.hold(task.book.states[tp])
        for topic in {task.book.states[tp].destination_topic for tp in partitions}:
            if (producer := task.deliveries.producer_of(topic)) is None:
                continue  # missing (its partitions are paused), or closed while idle: reopened with fresh metadata
            try:  # a destination topic grown a moment ago: its producer must know its new partitions
                producer.list_topics(topic, timeout=5)
            except KafkaException as exc:
                log.warning("destination metadata of %s unavailable: %s", topic, exc)
        task.on_event(f"replicating {len(partitions)} partition(s): {describe(partitions)}")

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

    # -- destinations -------------------------------------------------------------------------------------

    def destination_layouts(self, topics: set[str]) -> dict[str, TopicPartitions]:
        return topic_partitions(self.destination_admin(), topics)

    def destination_admin(self) -> AdminClient:
        """An admin client for one request: a long-lived one's background thread wakes 100 times a second (measured:
        0.5 % of a core, an idle task of 10,000 partitions used 4.3 % in all), and the task asks every few seconds."""
        return ClusterAdmin(self.task.config.admin_settings("destination"))

    def check_destination(self, partitions: list[SourcePartition] | None = None) -> None:
        """Map each partition to its destination partition; pause those whose destination is missing."""
        task = self.task
        states = [task.book.states[tp] for tp in partitions] if partitions else list(task.book.states.values())
        if not states:
            return
        try:
            layouts = self.destination_layouts({state.destination_topic for state in states})
        except Exception as exc:
            log.warning("destination metadata unavailable for %s-%d: %s", task.connector, task.task_id, exc)
            for state in states:
                if not state.routed and state.paused_reason is None:
                    # Its destination partition is unknown: producing now would let the partitioner scatter the
                    # partition's records over the destination's partitions, out of order. Wait and retry.
                    self.pause(state, f"destination metadata unavailable: {exc}")
            return
        self.map_destinations(states, layouts)

    def map_destinations(self, states: list[PartitionState], layouts: dict[str, TopicPartitions]) -> None:
        config, deliveries = self.task.config, self.task.deliveries
        for state in states:
            topic = layouts.get(state.destination_topic)
            if topic is None or topic.error is not None:
                if state.paused_reason is None:
                    error = topic.error if topic is not None else None
                    why = f" ({error})" if error is not None and "nknown topic" not in error else ""
                    self.pause(state, f"destination topic {state.destination_topic!r} does not exist{why}")
                continue
            if config.partition_matching is not False and state.partition in topic.ids:
                deliveries.route(state, state.partition, len(topic.ids))
            elif config.requires_destination_partition:
                if state.paused_reason is None:
                    self.pause(
                        state,
                        f"destination partition {state.destination_topic}[{state.partition}] "
                        "does not exist (partitions are preserved)",
                    )
            else:
                deliveries.route(state, UNASSIGNED_PARTITION, len(topic.ids))

    # -- one partition alone --------------------------------------------------------------------------------

    def source_error(self, msg: Message) -> None:
        task = self.task
        err = msg.error()
        assert err is not None  # only error events are handed here
        if err.code() == KafkaError._PARTITION_EOF:
            return
        topic, partition = msg.topic(), msg.partition()
        if err.code() in SOURCE_GONE and topic:
            gone = [tp for tp in task.book.states if tp[0] == topic and (partition in (None, -1) or tp[1] == partition)]
            for tp in gone:
                self.drop(tp, f"source partition disappeared: {err.str()}")
            return
        if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED and topic:
            # A missing ACL: librdkafka retries the fetch forever. The topic's partitions wait alone, retried with
            # their backoff, so that a grant resumes them without a restart.
            reason = self.refused_by("source", f"reading topic {topic!r}", err, ("Read", topic))
            for state in list(task.book.states.values()):
                if state.topic == topic and partition in (None, -1, state.partition) and state.paused_reason is None:
                    self.pause(state, reason)
            return
        if err.fatal():
            raise RuntimeError(f"source consumer failed: {err.str()}")
        log.warning("source error for %s-%d (%s[%s]): %s", task.connector, task.task_id, topic, partition, err.str())

    def refused_by(
        self, cluster: Literal["source", "destination"], doing: str, err: KafkaError, needed: tuple[str, str]
    ) -> str:
        """A refusal as an operator needs it: which cluster, as whom, doing what, and the ACL (operation, topic)
        that a TOPIC_AUTHORIZATION_FAILED says is missing."""
        identity = connection_identity(self.task.config.admin_settings(cluster))
        reason = f"{cluster} cluster ({identity}) refused {doing}: {err.str()} ({err.name()})"
        if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            reason += f"; the principal needs {needed[0]} on Topic {needed[1]!r} there (docs/SECURITY.md)"
        return reason

    def pause(self, state: PartitionState, reason: str) -> None:
        self.task.book.pause(state, reason)
        self.task.reader.pause([state.tp])
        self._show(state, PartitionHealth.PAUSED, reason)
        self.task.on_event(f"paused {state.topic}[{state.partition}]: {reason}")

    def follow_pauses(self, wanted: dict[SourcePartition, str]) -> None:
        """Hold the partitions an operator paused (`wanted`: partition -> reason) and let go of those resumed."""
        states = self.task.book.states
        for tp in self.held.keys() - wanted.keys():
            del self.held[tp]
            if (state := states.get(tp)) is not None and tp in self.task.book.paused:
                # Resumed by the retry duty (`tick`) once every record it had produced is answered: read again
                # sooner, those records would be written twice.
                state.retry_at = 0.0
        for tp, reason in wanted.items():
            if self.held.get(tp) != reason:
                self.held[tp] = reason
                if (state := states.get(tp)) is not None:
                    self.hold(state)

    def hold(self, state: PartitionState) -> None:
        """Stop reading a partition until an operator resumes it. What it produced is still acknowledged and
        committed; the rest of a batch in hand is skipped (`Forwarder.forward`) and read again on resuming."""
        reason = f"{OPERATOR_PAUSE}: {self.held[state.tp]}"
        state.paused_reason = reason
        self.task.book.paused[state.tp] = state  # with a failure's pause, if any: the operator's resume retries it
        state.retry_at = math.inf  # never retried by time
        self.task.reader.pause([state.tp])
        self.task.on_event(f"paused {state.topic}[{state.partition}]: {reason}")

    def retry(self, due: list[PartitionState]) -> None:
        """Resume the paused partitions whose backoff is over. The size limits of those refused for their size, and
        of destination topics not read yet (missing until now), are read first, in one request per cluster:
        clients that no longer fit are made again, which restarts every partition instead."""
        task = self.task
        again = {state.destination_topic for state in due if state.recheck_limit}
        if again or any(task.limits.unread()):
            for state in due:
                state.recheck_limit = False
            if self.limits_read(task.limits.learn(task.config, again)):
                return
        for state in due:
            if state.refused_against is not None and state.refused_against == state.size_limit:
                # The record it waits with exceeds that same limit still: read again, it would be refused again (and
                # the partition shown replicating meanwhile). It waits for its next backoff, and a new reading.
                state.recheck_limit = True
                task.book.pause(state, state.paused_reason or "")
                continue
            state.refused_against = None
            self.resume(state)

    def limits_read(self, changed: set[str]) -> bool:
        """Size limits were read (`changed`: destination topics whose limit changed). Clients made for other limits
        are made again, as for a new configuration version (records larger than their producer takes would be
        refused, batches larger than a destination topic takes would be refused by its broker); otherwise the
        partitions of `changed` are measured against their new limit. Whether the clients were made again."""
        task = self.task
        task.scheduler.ran(READING_SIZE_LIMITS, LIMITS_REFRESH_S)
        if task.clients_open and task.limits.sizes_of(task.config, task.task_id) != task.sized_for:
            task.rebuild(task.version, task.restart_marker, why="the topics' record size limits changed")
            return True
        for state in task.book.states.values():
            if state.destination_topic in changed:
                task.limits.fit(state, task.config)
        return False

    def resume(self, state: PartitionState) -> None:
        """Retry a paused partition from its first unacknowledged offset."""
        reason = self.task.book.unpause(state)
        self.check_destination([state.tp])
        if state.paused_reason is not None:
            return  # still missing: check_destination paused it again with a longer backoff
        restart = self.read_again(state)
        self.task.reader.resume([state.tp])
        self._show(state, PartitionHealth.ACTIVE, None)
        self.task.on_event(f"resumed {state.topic}[{state.partition}] at offset {restart} (was: {reason})")

    def restarted(self, was_paused: list[SourcePartition]) -> None:
        """Partitions paused before the task's clients were made again, started since: shown replicating again
        unless paused anew (an operator's hold, a destination still missing)."""
        for tp in was_paused:
            if (state := self.task.book.states.get(tp)) is not None and state.paused_reason is None:
                self._show(state, PartitionHealth.ACTIVE, None)

    def read_again(self, state: PartitionState) -> int | None:
        """Read a partition again from its first unacknowledged offset (returned): nothing produced is awaited."""
        restart = self.task.book.read_again(state)
        if restart is not None:
            self.task.reader.seek(state.tp, restart)
        return restart

    def drop(self, tp: SourcePartition, reason: str) -> None:
        task = self.task
        task.reader.unassign([tp])
        task.book.remove(tp)
        task.store.set_partition_state(task.lease, tp, PartitionHealth.DROPPED, reason)
        task.on_event(f"dropped {tp[0]}[{tp[1]}]: {reason}")

    def _show(self, state: PartitionState, shown: PartitionHealth, reason: str | None) -> None:
        """Record a pause or resume for operators; a database outage must not stop replication for it."""
        try:
            self.task.store.set_partition_state(self.task.lease, state.tp, shown, reason)
        except SQLAlchemyError as exc:
            log.warning("partition state of %s[%d] not recorded: %s", state.topic, state.partition, exc)
