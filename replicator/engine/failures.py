"""What a refused record or a failed producer does to the task's partitions, decided here alone.

  a refused record   `decide`: the destination refused it (or the task did, before sending): its partition alone
                     pauses with the reason and waits for its backoff (`PartitionPauses.pause`), from that offset
  a failed producer  a refusal that says the producer failed (every partition would see the same) pauses no
                     partition: the producer is marked failed (`Deliveries.failure`) and `replace_producer` replaces
                     it, reading every partition the destination did not refuse again from its first unacknowledged
                     record (at least once; exactly once, `TransactionalCommitter` replaces it and rewinds instead)

Refusals and failures are data the deliveries keep (`Deliveries.refusals`, `Deliveries.failure`); the committer of the
task's delivery mode takes them once a loop and decides with this module (`Committer.settle`): what differs between
the modes (a refusal aborts a transaction, a purge is no refusal) is the committer's, never asked here.
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import KafkaError

from replicator.engine.deliveries import Deliveries, Refusal
from replicator.engine.partitions import UNASSIGNED_PARTITION, PartitionBook, PartitionState
from replicator.engine.pauses import PartitionPauses
from replicator.engine.record_limits import broker_refusal_hint

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


class DeliveryFailures:
    """Decides what a refused record and a failed producer do to the partitions (see the module)."""

    def __init__(
        self, deliveries: Deliveries, book: PartitionBook, pauses: PartitionPauses, on_event: Callable[[str], None]
    ) -> None:
        self.deliveries = deliveries
        self.book = book
        self.pauses = pauses
        self.on_event = on_event

    def decide(self, refusal: Refusal) -> None:
        """A refused record: its partition waits for its backoff, from that offset, unless the producer failed."""
        state, offset, err = refusal.state, refusal.offset, refusal.err
        if self.book.states.get(state.tp) is not state:
            return  # released (or its clients made again) since: its next owner reads it from its commit
        if err.fatal() or err.code() in PRODUCER_BROKEN or refusal.purged:
            # The producer failed, not this partition's record: every partition would see the same. Pausing it
            # with a backoff would stop partitions the destination accepts whenever another one's refusal stops
            # the producer (a gapless producer stops on any refused batch).
            if not refusal.purged:
                self.deliveries.failed(err)
            state.awaiting_new_producer()
            return
        # (A record of this partition may have failed with the stopped producer before its refusal was taken.)
        if state.paused_reason is None or state.awaiting:
            self.pauses.pause(state, refusal.why or self._refusal_reason(state, offset, err))

    def _refusal_reason(self, state: PartitionState, offset: int, err: KafkaError) -> str:
        if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:  # a missing ACL: say whose and which
            topic = state.destination_topic
            return self.pauses.refused_by("destination", f"writing to {topic!r}", err, ("Write", topic))
        why = f"destination refused offset {offset}: {err.str()} ({err.name()})"
        return why + broker_refusal_hint(state) if err.code() == KafkaError.MSG_SIZE_TOO_LARGE else why

    def replace_producer(self, err: KafkaError) -> None:
        """At least once: a producer failed fatally (`Deliveries.failure`, taken). A new producer reads every
        partition the destination did not refuse again from its first unacknowledged record."""
        deliveries = self.deliveries
        self.on_event(f"producer failed fatally ({err}); recreating it")
        deliveries.purge()
        for refusal in deliveries.take_refusals():  # purged records, and refusals that came meanwhile
            self.decide(refusal)
        deliveries.take_failure()  # this producer's own error again, if it is repeated while purging
        deliveries.conclude_cut_runs(delivered=False)
        deliveries.replace_producers()
        again = 0
        for state in self.book.states.values():
            if state.destination_partition != UNASSIGNED_PARTITION:
                state.route(state.destination_partition, deliveries.ordered_acks)
            # Partitions the destination did not refuse go on at once, from their first unacknowledged record;
            # a refused one waits for its backoff (`AssignmentFollower.unpause`).
            if state.paused_reason is None or state.awaiting:
                state.unpaused()
                self.pauses.read_again(state)
                again += 1
        self.on_event(f"new producer: {again} partition(s) read again from their first unacknowledged offset")
