"""Fetch, map, produce, acknowledge: records from the task's source reader to its destination producer, in order.

  fetch       `poll_once`: `SourceReader.consume()` on the assigned partitions, forwarding at once; partitions that
              flow are fetched eagerly, quiet ones cheaply (`replicator.engine.source_reader`)
  map         `forward`: destination topic and partition, user headers plus provenance headers, cycle guard
  produce     `forward`: `produce()` of the producer writing the record's destination topic (one per group of
              topics, `replicator.engine.producers`) with key, value, headers and source timestamp (`_produce_again`
              when the local queue is full or the record is refused before sending; a record too large for its
              destination topic is refused before that, `replicator.engine.record_limits`)
  acknowledge `_acknowledged`: the destination acknowledged (or refused) a run of records (`InFlight`); with an
              idempotent, gapless producer one acknowledgement stands for every earlier record of the partition

What is acknowledged is committed by the task's committer (`replicator.engine.committer`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from replicator.engine.context import TaskContext
from replicator.engine.partitions import AWAITING_NEW_PRODUCER, UNASSIGNED_PARTITION, InFlight, PartitionState
from replicator.engine.producers import DestinationProducers
from replicator.engine.record_limits import broker_refusal_hint, oversized, producer_refusal_reason
from replicator.engine.throttle import Throttle
from replicator.partition_reader import Record
from replicator.topics import provenance

log = logging.getLogger(__name__)

BATCH = 10000  # records taken from the consumer's queue at most per loop; never waited for
MAX_BLOCK_S = 1.0  # never block longer: a stop is noticed between two turns of the loop (`should_stop`)
# While records await acknowledgement, the loop waits for new records at most this long, so acknowledgements are
# served (and their time taken for the latency metric) within a few milliseconds of their arrival.
ACK_SERVE_S = 0.005
REFUSAL_DRAIN_S = 5.0  # how long a refusal before sending waits for the records produced just before it
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


class Forwarder:
    """The task's destination producers and the records on their way to them."""

    def __init__(self, task: TaskContext, producer_settings: dict[str, Any]) -> None:
        self.task = task
        self.settings = producer_settings  # every producer's, sized for the task's destination topics
        self.producers = DestinationProducers(
            self.new_producer,
            grouped=not task.config.exactly_once,
            idle_close_s=task.reader.quiet_after_s + task.reader.dormant_after_s,
        )
        self.ordered_acks = task.config.ordered_acks
        queue_limit = int(producer_settings["queue.buffering.max.messages"])
        self.intake_limit = max(queue_limit - BATCH, queue_limit // 2)  # records waiting above which none are read
        self.fatal_error: KafkaError | None = None  # the producer is done for: the loop replaces it
        self.unsettled = False  # runs cut short await the producer's emptying (`settle`)
        self.now_ms = 0
        self.throttle: Throttle | None = None
        self.rethrottle()

    def rethrottle(self) -> None:
        """This task's share of the connector's throttle, from the configuration and the number of tasks."""
        config = self.task.config
        self.throttle = Throttle.of(
            config.throttle_records_per_second, config.throttle_bytes_per_second, self.task.follower.tasks
        )

    def new_producer(self) -> Producer:
        return Producer({**self.settings, "error_cb": self._producer_error})

    @property
    def producer(self) -> Producer:
        """The one producer of exactly-once mode (`DestinationProducers.first`)."""
        return self.producers.first

    def producer_of(self, topic: str) -> Producer | None:
        """The producer writing destination `topic`, once a partition of it was routed."""
        return self.producers.of(topic)

    def route(self, state: PartitionState, partition: int, destination_partitions: int) -> None:
        """Write `state`'s records to destination `partition`, through the producer of its destination topic (of
        `destination_partitions` partitions)."""
        if state.routed and state.destination_partition == partition:
            return  # (the periodic destination check finds most partitions where they were)
        state.route(partition, self.ordered_acks)
        state.produce = self._produce_through(self.producers.index_for(state.destination_topic, destination_partitions))

    def _produce_through(self, group: int) -> Callable[..., None]:
        """`produce` of the group's producer; while it is closed, a function that opens it again first."""
        producer = self.producers.all[group]
        if producer is not None:
            return producer.produce

        def reopen_and_produce(*args: Any) -> None:
            opened = self.producers.open(group)
            self._point({group: opened.produce})
            opened.produce(*args)

        return reopen_and_produce

    def _point(self, produce_by_group: dict[int, Callable[..., None]]) -> None:
        """Each partition of these groups' topics writes through the group's `produce` from now on."""
        group_of = self.producers.topics
        for state in self.task.book.states.values():
            if (group := group_of.get(state.destination_topic)) in produce_by_group:
                state.produce = produce_by_group[group]

    def close_idle_producers(self, now: float) -> None:
        """Close the producers idle for as long as a partition takes to turn dormant (`DestinationProducers`)."""
        if closed := self.producers.close_idle(now):
            self._point({group: self._produce_through(group) for group in closed})

    # -- fetch, map, produce ----------------------------------------------------------------------------

    def poll_once(self) -> None:
        task, producer = self.task, self.producers
        timeout = min(task.config.poll_timeout_ms / 1000, MAX_BLOCK_S)
        if not task.book.states:
            time.sleep(min(timeout, 0.2))  # nothing assigned yet; housekeeping will pick work up
            return
        # Forward whatever has arrived, at once: `consume(n, t)` would hold records back until n arrived or t
        # passed. Only an empty queue is waited on, and only until its first record (or an acknowledgement) is due.
        msgs: list[Record]
        if not task.committer.accepting():  # exactly-once: until the transaction's records are acknowledged
            msgs = []
        elif len(producer) > self.intake_limit:
            # The destination is behind (e.g. thousands of partitions catching up, each sent as a request of its
            # own): read no more until a batch fits, so the backlog waits in Kafka, not in this process's memory.
            msgs = []
            self.serve(ACK_SERVE_S)
        else:
            throttle = self.throttle
            allowed = BATCH if throttle is None else throttle.allowance(BATCH)
            if throttle is not None and not allowed:
                # Over the connector's throttle: read nothing (the backlog waits in Kafka) until the budget allows.
                msgs = []
                self.serve(min(throttle.wait_s(), timeout))
            else:
                msgs = task.reader.consume(allowed, 0)
                if not msgs:
                    msgs = task.reader.consume(
                        1, ACK_SERVE_S if len(producer) else timeout, until=task.head_changed.is_set
                    )
                if throttle is not None:
                    throttle.take(msgs)
        if msgs:
            self.forward(msgs)
        self.now_ms = time.time_ns() // 1_000_000  # acknowledgement time of everything this poll serves
        self.serve(task.committer.serve_wait_s())
        if self.fatal_error is not None:
            err, self.fatal_error = self.fatal_error, None
            task.committer.producer_failed(err)
        elif self.unsettled and not len(producer):
            self.settle(delivered=True)

    def forward(self, msgs: list[Record]) -> None:
        """Map and produce a batch of records, in order. This loop runs once per record: it stays flat, and the
        produce call is inline (a method call per record costs as much as the bookkeeping).

        Each record is produced once the next one is seen, which tells whether it ends its partition's run in this
        batch: only a run's last record carries a delivery callback (`InFlight`). The batch ends with `None`."""
        task = self.task
        task.book.touched += 1
        acknowledged = self._acknowledged
        partitions, with_provenance = task.book.states, task.config.provenance_headers
        destination, origin_header, source = task.destination_cluster, task.origin_header, provenance.SOURCE
        # The record seen and not yet produced: it, its partition, offset, outgoing headers and timestamp.
        held: Record | None = None
        # Read only while `held` is set: an Optional would cost a check per record.
        hstate: PartitionState = None  # type: ignore[assignment]
        hoffset = hts = 0
        hheaders: Any = None
        state: PartitionState | None = None
        for msg in (*msgs, None):
            cycle = False  # the record was first produced on the destination cluster: never written back
            if msg is not None:
                if msg.error() is not None:  # an error event, not a record (`Record`)
                    task.follower.source_error(cast(Message, msg))
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
                size = (len(value) if value else 0) + (len(key) if key else 0)
                callback = partial(acknowledged, hstate, run) if last else None
                # Only a record near its destination topic's limit is measured (headers and framing included).
                if size > hstate.size_check and (why := oversized(hstate, hoffset, key, value, hheaders)):
                    hstate.refused_against = hstate.size_limit
                    produced = self._refuse_unsent(hstate, run, hoffset, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), why)
                else:
                    try:
                        # Positional: confluent-kafka parses keyword arguments at a cost per record (~0.3 µs). The
                        # order is its keyword list's: topic, value, key, partition, callback, on_delivery,
                        # timestamp, headers.
                        hstate.produce(
                            hstate.destination_topic,
                            value,
                            key,
                            hstate.destination_partition,
                            callback,
                            None,
                            hts,
                            hheaders,
                        )
                        produced = True
                    except (BufferError, KafkaException) as exc:
                        produced = self._produce_again(exc, hstate, run, hoffset, value, key, callback, hts, hheaders)
                if produced:
                    hstate.position = hoffset + 1
                    hstate.in_flight += 1
                    run.count += 1
                    run.size += size
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
        self,
        exc: Exception,
        state: PartitionState,
        run: InFlight,
        offset: int,
        value: bytes | None,
        key: bytes | None,
        callback: Callable[..., None] | None,
        ts: int,
        headers: Any,
    ) -> bool:
        """`produce()` raised: serve acknowledgements while the local queue is full, then try again; a record refused
        before sending pauses its partition and cuts its run short. Whether the record was produced."""
        while isinstance(exc, BufferError):
            self.serve(0.05)
            try:
                state.produce(
                    state.destination_topic, value, key, state.destination_partition, callback, None, ts, headers
                )
                return True
            except (BufferError, KafkaException) as again:
                exc = again
        assert isinstance(exc, KafkaException)  # refused before sending: too large, or the producer stopped
        err: KafkaError = exc.args[0]
        if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
            why = producer_refusal_reason(state, offset, (key, value, headers), self.settings, self.task.config, err)
            return self._refuse_unsent(state, run, offset, err, why)
        self._cut_run(state, run)
        self.refused(state, offset, err)
        if run.count:  # the run's records so far carry no callback: find out whether they arrived
            self.drain(REFUSAL_DRAIN_S)
        return False

    def _refuse_unsent(self, state: PartitionState, run: InFlight, offset: int, err: KafkaError, why: str) -> bool:
        """A record too large to be produced: its partition waits with `why` (and its limit is read again before the
        retry); the run's records before it are acknowledged once the producer delivered them. Never produced, so
        no transaction holds it: exactly-once mode goes on without an abort. Returns False (not produced)."""
        self._cut_run(state, run)
        self.refused(state, offset, err, why, sent=False)
        if run.count:  # the run's records so far carry no callback: find out whether they arrived
            self.drain(REFUSAL_DRAIN_S)
        return False

    @staticmethod
    def _cut_run(state: PartitionState, run: InFlight) -> None:
        """End the run before the record just refused (and forget it if it holds nothing yet)."""
        state.open_run = None
        if not run.count:
            state.pending.pop()

    # -- acknowledge ------------------------------------------------------------------------------------

    def _acknowledged(self, state: PartitionState, run: InFlight, err: KafkaError | None, msg: Message | None) -> None:
        """The destination acknowledged (or refused) a run's last record, and with it the whole run."""
        self.task.book.touched += 1
        state.in_flight -= run.count
        if err is not None:
            self.refused(state, run.first, err)  # the run stays in `pending`: nothing is committed past it
            return
        run.done = True
        pending = state.pending
        while pending and pending[0].done:
            pending.popleft()
        # Counted into the topic's counters at once: records, bytes and each record's latency (source CreateTime to
        # acknowledgement). Per record, not sampled: a backlog mixes old and new records, and the latency report's
        # buckets (Mirus's 5m … 12h) must count each one where it belongs. A run at a time: no pause to fold a busy
        # second.
        acknowledged = self.task.metrics.counters_for(state.topic)
        acknowledged.add(run.count, run.size)
        acknowledged.add_latencies(self.now_ms, run.timestamps)
        # (A delivered record's offset is None only without acknowledgements, acks=0, which an ordered state rules out.)
        if msg is not None and state.ordered and (offset := msg.offset()) is not None:
            state.destination_next = offset + 1

    def drain(self, timeout: float) -> None:
        """Wait until the producer has delivered everything, serving acknowledgements, and settle the runs cut short
        (see `settle`) once it has; a fatal error ends the wait (the loop replaces the producer).

        Not `flush()`: a fatal error raised while confluent-kafka's flush waits comes out as a SystemError or as an
        object no `except` clause catches (seen on a gapless producer whose batch the broker refused), where
        `poll()` raises it as the KafkaException `serve` handles."""
        producer = self.producers
        deadline = time.monotonic() + timeout
        while len(producer) and self.fatal_error is None and (left := deadline - time.monotonic()) > 0:
            self.serve(min(left, 0.1))
        if not len(producer) and self.fatal_error is None:
            self.settle(delivered=True)
        else:
            self.unsettled = True  # settled by the loop once the producer is empty (or given up with it)

    def settle(self, delivered: bool) -> None:
        """Runs whose last record carried no callback (cut short by a refusal of the next record, or by an
        interruption): acknowledged once the producer has delivered everything without a fatal error (with gapless
        ordering, or inside a transaction, nothing of them can then be missing); given up otherwise — they stay at
        the head of `pending`, so their partition is re-read from their first offset when it resumes."""
        self.unsettled = False
        for state in self.task.book.states.values():
            state.open_run = None
            for run in [r for r in state.pending if not r.tail_sent]:
                run.tail_sent = True
                if delivered:
                    self._acknowledged(state, run, None, None)
                else:
                    state.in_flight -= run.count

    def refused(
        self, state: PartitionState, offset: int, err: KafkaError, why: str | None = None, sent: bool = True
    ) -> None:
        """The destination refused a record of `state` at `offset` (or, `sent` False, the task did before producing
        it, saying `why`): the partition waits for its backoff, from that offset."""
        if sent and not self.task.committer.refusal_counts(state, offset, err):
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
                self.fatal_error = err
            if state.paused_reason is None:
                state.paused_reason = AWAITING_NEW_PRODUCER
            return
        # (A record of this partition may have failed with the stopped producer before its refusal was served.)
        if state.paused_reason is None or state.paused_reason is AWAITING_NEW_PRODUCER:
            self.task.follower.pause(state, why or self._refusal_reason(state, offset, err))

    def _refusal_reason(self, state: PartitionState, offset: int, err: KafkaError) -> str:
        if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:  # a missing ACL: say whose and which
            topic = state.destination_topic
            return self.task.follower.refused_by("destination", f"writing to {topic!r}", err, ("Write", topic))
        why = f"destination refused offset {offset}: {err.str()} ({err.name()})"
        return why + broker_refusal_hint(state) if err.code() == KafkaError.MSG_SIZE_TOO_LARGE else why

    # -- the producer ---------------------------------------------------------------------------------------

    def purge(self) -> None:
        """Drop every record not yet sent; purged records come back as refusals (`refused` leaves their partitions
        to the next producer), served here for up to 30 s."""
        self.producers.purge()
        deadline = time.monotonic() + 30
        while len(self.producers) and time.monotonic() < deadline:
            self.serve(0.1)

    def recreate_producer(self, err: KafkaError) -> None:
        """An idempotent producer's fatal error ends that producer: start a new one, and read every partition the
        destination did not refuse again from its first unacknowledged record."""
        task = self.task
        task.on_event(f"producer failed fatally ({err}); recreating it")
        self.purge()
        self.fatal_error = None  # this producer's own error again, if it is repeated while purging
        self.settle(delivered=False)
        self.replace_producers()
        again = 0
        for state in task.book.states.values():
            if state.destination_partition != UNASSIGNED_PARTITION:
                state.route(state.destination_partition, self.ordered_acks)
            # Partitions the destination did not refuse go on at once, from their first unacknowledged record;
            # a refused one waits for its backoff (`AssignmentFollower.resume`).
            if state.paused_reason is None or state.paused_reason is AWAITING_NEW_PRODUCER:
                state.paused_reason = None
                task.follower.read_again(state)
                again += 1
        task.on_event(f"new producer: {again} partition(s) read again from their first unacknowledged offset")

    def close(self) -> None:
        """Close the producers (`DestinationProducers.close`): the task stops, or makes its clients again."""
        self.producers.close()

    def replace_producers(self) -> None:
        """New producers in place of the failed ones, each partition writing through its topic's new producer."""
        self.producers.replace()
        self._point({group: self._produce_through(group) for group in range(len(self.producers.all))})

    def serve(self, timeout: float) -> None:
        """Serve acknowledgements; a fatal producer error (raised by poll()) marks the producer for replacement."""
        try:
            self.producers.poll(timeout)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if not err.fatal():
                raise
            self.fatal_error = self.fatal_error or err

    def _producer_error(self, err: KafkaError) -> None:
        """librdkafka's error callback: without one, a fatal producer error is raised from poll()."""
        if err.fatal():
            self.fatal_error = self.fatal_error or err
        else:  # transient (a broker down, a connection reset): librdkafka retries by itself
            log.debug("producer of %s-%d: %s", self.task.connector, self.task.task_id, err.str())
