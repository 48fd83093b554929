"""What a refused record or a failed producer does, decided here alone.

  a refused record   `refused`: the destination refused it (or the task did, before sending): its partition alone
                     pauses with the reason and waits for its backoff (`PartitionPauses.pause`), from that offset;
                     exactly-once mode's committer is told first (its transaction must be aborted), and a record purged
                     by an abort is not a refusal
  a failed producer  a refusal that says the producer failed (every partition would see the same) pauses no
                     partition: the producer is marked failed (`Deliveries.failure`) and `producer_failed` replaces it,
                     reading every partition the destination did not refuse again — at least once from its first
                     unacknowledged record; exactly once, the transactional committer replaces it and rewinds every
                     partition to its last committed record (`TransactionalCommitter.producer_failed`)

The forwarder and the deliveries hand refusals here (`Forwarder.forward`, `Deliveries.acknowledged`), and the
forwarder a failed producer (`Forwarder.poll_once`); what follows runs from here in one direction, to the deliveries'
producers, the partition pauses and the committer, never back to the forwarder.
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import KafkaError

from replicator.engine.committer import Committer
from replicator.engine.deliveries import Deliveries
from replicator.engine.partitions import AWAITING_NEW_PRODUCER, UNASSIGNED_PARTITION, PartitionBook, PartitionState
from replicator.engine.pauses import PartitionPauses
from replicator.engine.record_limits import broker_refusal_hint
from replicator.engine.transactions import TransactionalCommitter

# The destination no longer accepts this producer's identity (id, epoch, sequence), or the producer stopped after
# an error that could leave a gap (`enable.gapless.guarantee`): retrying with the same producer cannot succeed, a
# new one can (as after a network cut timed records out mid-flight). A timeout (only with a user-set
# `producer.message.timeout.ms`) replaces it too, so no later record of the partition is written before the
# timed-out one is sent again.
PRODUCER_BROKEN = {
    KafkaError._MSG_TIMED_OUT, KafkaError._FATAL,
    KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH, KafkaError._FENCED, KafkaError.UNKNOWN_PRODUCER_ID,
    KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, KafkaError.INVALID_PRODUCER_ID_MAPPING, KafkaError._INCONSISTENT,
}  # fmt: skip
# Records the task purged from a producer it is replacing: they are read again, they were not refused.
PURGED = {KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT}


class DeliveryFailures:
    """Decides what a refused record and a failed producer do (see the module)."""

    def __init__(
        self,
        deliveries: Deliveries,
        book: PartitionBook,
        partitions: PartitionPauses,
        committer: Committer,
        on_event: Callable[[str], None],
    ) -> None:
        self.deliveries = deliveries
        self.book = book
        self.partitions = partitions
        self.committer = committer
        self.on_event = on_event

    def refused(
        self, state: PartitionState, offset: int, err: KafkaError, why: str | None = None, sent: bool = True
    ) -> None:
        """The destination refused a record of `state` at `offset` (or, `sent` False, the task did before producing
        it, saying `why`): the partition waits for its backoff, from that offset."""
        if sent and not self.committer.refusal_counts(state, offset, err):
            return
        if state.failed_at is None or offset < state.failed_at:
            state.failed_at = offset
        if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
            state.recheck_limit = True  # raised meanwhile, the limit lets the retry through
        if err.fatal() or err.code() in PRODUCER_BROKEN or err.code() in PURGED:
            # The producer failed, not this partition's record: every partition would see the same. Pausing it
            # with a backoff would stop partitions the destination accepts whenever another one's refusal stops
            # the producer (a gapless producer stops on any refused batch).
            if err.code() not in PURGED:
                self.deliveries.failed(err)
            if state.paused_reason is None:
                state.paused_reason = AWAITING_NEW_PRODUCER
            return
        # (A record of this partition may have failed with the stopped producer before its refusal was polled.)
        if state.paused_reason is None or state.paused_reason is AWAITING_NEW_PRODUCER:
            self.partitions.pause(state, why or self._refusal_reason(state, offset, err))

    def _refusal_reason(self, state: PartitionState, offset: int, err: KafkaError) -> str:
        if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:  # a missing ACL: say whose and which
            topic = state.destination_topic
            return self.partitions.refused_by("destination", f"writing to {topic!r}", err, ("Write", topic))
        why = f"destination refused offset {offset}: {err.str()} ({err.name()})"
        return why + broker_refusal_hint(state) if err.code() == KafkaError.MSG_SIZE_TOO_LARGE else why

    def producer_failed(self, err: KafkaError) -> None:
        """A producer failed fatally (`Deliveries.failure`, taken). Exactly once, its transaction failed with it: the
        transactional committer replaces it and rewinds every partition. At least once, a new producer reads every
        partition the destination did not refuse again from its first unacknowledged record."""
        if isinstance(self.committer, TransactionalCommitter):
            self.committer.producer_failed(err)
            return
        deliveries = self.deliveries
        self.on_event(f"producer failed fatally ({err}); recreating it")
        deliveries.purge()
        deliveries.take_failure()  # this producer's own error again, if it is repeated while purging
        deliveries.conclude_cut_runs(delivered=False)
        deliveries.replace_producers()
        again = 0
        for state in self.book.states.values():
            if state.destination_partition != UNASSIGNED_PARTITION:
                state.route(state.destination_partition, deliveries.ordered_acks)
            # Partitions the destination did not refuse go on at once, from their first unacknowledged record;
            # a refused one waits for its backoff (`AssignmentFollower.resume`).
            if state.paused_reason is None or state.paused_reason is AWAITING_NEW_PRODUCER:
                state.paused_reason = None
                self.partitions.read_again(state)
                again += 1
        self.on_event(f"new producer: {again} partition(s) read again from their first unacknowledged offset")
