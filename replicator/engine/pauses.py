"""One partition alone: paused after a failure (retried with a backoff by the assignment follower), held by an
operator's hand (`partition_pauses`, kept until an operator resumes the partition), read again from its first
unacknowledged offset, or dropped when its source partition disappeared; each shown to operators
(`partition_status`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

from confluent_kafka import KafkaError, Message
from sqlalchemy.exc import SQLAlchemyError

from replicator.assignment import SourcePartition
from replicator.clusters import connection_identity
from replicator.engine.clients import Clients
from replicator.engine.partitions import PartitionBook, PartitionState
from replicator.state.records import OPERATOR_PAUSE, Lease, PartitionHealth
from replicator.state.store import Store

log = logging.getLogger(__name__)

SOURCE_GONE = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}


class PartitionPauses:
    """Pauses, holds, re-reads and drops of single partitions, in the book, the reader and `partition_status`."""

    def __init__(
        self, store: Store, lease: Callable[[], Lease], book: PartitionBook, on_event: Callable[[str], None], name: str
    ) -> None:
        self.store = store
        self.lease = lease  # the task's, claimed after its parts are made (a warm standby's)
        self.book = book
        self.on_event = on_event
        self.name = name  # the task's, in logs
        self.clients: Clients  # the current ones (`use`)
        self.held: dict[SourcePartition, str] = {}  # partitions an operator paused, owned or not -> the reason

    def use(self, clients: Clients) -> None:
        """The clients `ReplicationTask.rebuild` made: partitions are paused in their reader from now on."""
        self.clients = clients

    def source_error(self, msg: Message) -> None:
        """An error event among the source records (`Forwarder.forward`): a partition gone is dropped, a topic the
        task may not read waits alone; a fatal one fails the task."""
        err = msg.error()
        assert err is not None  # only error events are handed here
        if err.code() == KafkaError._PARTITION_EOF:
            return
        topic, partition = msg.topic(), msg.partition()
        if err.code() in SOURCE_GONE and topic:
            gone = [tp for tp in self.book.states if tp[0] == topic and (partition in (None, -1) or tp[1] == partition)]
            for tp in gone:
                self.drop(tp, f"source partition disappeared: {err.str()}")
            return
        if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED and topic:
            # A missing ACL: librdkafka retries the fetch forever. The topic's partitions wait alone, retried with
            # their backoff, so that a grant resumes them without a restart.
            reason = self.refused_by("source", f"reading topic {topic!r}", err, ("Read", topic))
            for state in list(self.book.states.values()):
                if state.topic == topic and partition in (None, -1, state.partition) and state.paused_reason is None:
                    self.pause(state, reason)
            return
        if err.fatal():
            raise RuntimeError(f"source consumer failed: {err.str()}")
        log.warning("source error for %s (%s[%s]): %s", self.name, topic, partition, err.str())

    def refused_by(
        self, cluster: Literal["source", "destination"], doing: str, err: KafkaError, needed: tuple[str, str]
    ) -> str:
        """A refusal as an operator needs it: which cluster, as whom, doing what, and the ACL (operation, topic)
        that a TOPIC_AUTHORIZATION_FAILED says is missing."""
        identity = connection_identity(self.clients.config.admin_settings(cluster))
        reason = f"{cluster} cluster ({identity}) refused {doing}: {err.str()} ({err.name()})"
        if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            reason += f"; the principal needs {needed[0]} on Topic {needed[1]!r} there (docs/SECURITY.md)"
        return reason

    def pause(self, state: PartitionState, reason: str) -> None:
        """Stop reading a partition until its backoff is over (`AssignmentFollower.retry`)."""
        self.book.pause(state, reason)
        self.clients.reader.pause([state.tp])
        self.show(state, PartitionHealth.PAUSED, reason)
        self.on_event(f"paused {state.topic}[{state.partition}]: {reason}")

    def follow_pauses(self, wanted: dict[SourcePartition, str]) -> None:
        """Hold the partitions an operator paused (`wanted`: partition -> reason) and let go of those resumed."""
        states = self.book.states
        for tp in self.held.keys() - wanted.keys():
            del self.held[tp]
            if (state := states.get(tp)) is not None and tp in self.book.paused:
                # Resumed by the retry duty (`AssignmentFollower.tick`) once every record it had produced is answered:
                # read again sooner, those records would be written twice.
                state.retry_now()
        for tp, reason in wanted.items():
            if self.held.get(tp) != reason:
                self.held[tp] = reason
                if (state := states.get(tp)) is not None:
                    self.hold(state)

    def hold(self, state: PartitionState) -> None:
        """Stop reading a partition until an operator resumes it. What it produced is still acknowledged and
        committed; the rest of a batch in hand is skipped (`Forwarder.forward`) and read again on resuming."""
        reason = f"{OPERATOR_PAUSE}: {self.held[state.tp]}"
        self.book.hold(state, reason)
        self.clients.reader.pause([state.tp])
        self.on_event(f"paused {state.topic}[{state.partition}]: {reason}")

    def restarted(self, was_paused: list[SourcePartition]) -> None:
        """Partitions paused before the task's clients were made again, started since: shown replicating again
        unless paused anew (an operator's hold, a destination still missing)."""
        for tp in was_paused:
            if (state := self.book.states.get(tp)) is not None and state.paused_reason is None:
                self.show(state, PartitionHealth.ACTIVE, None)

    def read_again(self, state: PartitionState) -> int | None:
        """Read a partition again from its first unacknowledged offset (returned): nothing produced is awaited."""
        restart = state.read_again()
        if restart is not None:
            self.clients.reader.seek(state.tp, restart)
        return restart

    def drop(self, tp: SourcePartition, reason: str) -> None:
        self.clients.reader.unassign([tp])
        self.book.remove(tp)
        self.store.set_partition_state(self.lease(), tp, PartitionHealth.DROPPED, reason)
        self.on_event(f"dropped {tp[0]}[{tp[1]}]: {reason}")

    def show(self, state: PartitionState, shown: PartitionHealth, reason: str | None) -> None:
        """Record a pause or resume for operators; a database outage must not stop replication for it."""
        try:
            self.store.set_partition_state(self.lease(), state.tp, shown, reason)
        except SQLAlchemyError as exc:
            log.warning("partition state of %s[%d] not recorded: %s", state.topic, state.partition, exc)
