"""Acknowledge: the task's destination producers as its partitions write through them, and what comes back.

  route        `route`: each partition writes through the producer of its destination topic's group
               (`replicator.engine.producers`), to the destination partition of its number
  acknowledge  `acknowledged`: the destination acknowledged (or refused) a run of records (`InFlight`); with an
               idempotent, gapless producer one acknowledgement stands for every earlier record of the partition
  cut runs     runs whose last record carried no callback (a refusal of the next record cut them short) are
               acknowledged once the producer delivered everything (`drain`, `acknowledge_cut_runs`)
  failure      a fatal producer error (raised by poll(), or librdkafka's error callback) is kept in `failure` until
               the task replaces the producers (`replicator.engine.failures` decides how)

A refusal is handed to `refused` (`DeliveryFailures.refused`), which decides what it does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from replicator.engine.metrics import TaskMetrics
from replicator.engine.partitions import InFlight, PartitionBook, PartitionState
from replicator.engine.producers import DestinationProducers

log = logging.getLogger(__name__)

MAX_BLOCK_S = 1.0  # never block longer: a stop is noticed between two turns of the loop (`should_stop`)
# While records await acknowledgement, the loop waits for new records at most this long, so acknowledgements are
# polled (and their time taken for the latency metric) within a few milliseconds of their arrival.
ACK_POLL_S = 0.005

Refused = Callable[[PartitionState, int, KafkaError], None]


class Deliveries:
    """The destination producers, which one each partition writes through, and their acknowledgements."""

    def __init__(
        self,
        producer_settings: dict[str, Any],
        book: PartitionBook,
        metrics: TaskMetrics,
        refused: Refused,
        *,
        ordered_acks: bool,
        grouped: bool,
        idle_close_s: float,
        name: str,
    ) -> None:
        self.settings = producer_settings  # every producer's, sized for the task's destination topics
        self.book = book
        self.metrics = metrics
        self.refused = refused  # a record the destination refused: what follows is decided there
        self.ordered_acks = ordered_acks
        self.name = name  # the task, in log lines
        self.producers = DestinationProducers(self._new_producer, grouped=grouped, idle_close_s=idle_close_s)
        self.failure: KafkaError | None = None  # a producer is done for: the task replaces them
        self.cut_runs = False  # runs cut short await the producer's emptying (`acknowledge_cut_runs`)
        self.now_ms = 0  # acknowledgement time (`acknowledged`) of what the polls bring, given to `poll_acks`

    def _new_producer(self) -> Producer:
        return Producer({**self.settings, "error_cb": self._producer_error})

    def __len__(self) -> int:
        """Records produced and not yet acknowledged."""
        return len(self.producers)

    @property
    def producer(self) -> Producer:
        """The one producer of exactly-once mode (`DestinationProducers.first`)."""
        return self.producers.first

    def producer_of(self, topic: str) -> Producer | None:
        """The producer writing destination `topic`, once a partition of it was routed."""
        return self.producers.of(topic)

    # -- route ----------------------------------------------------------------------------------------------

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
        for state in self.book.states.values():
            if (group := group_of.get(state.destination_topic)) in produce_by_group:
                state.produce = produce_by_group[group]

    def close_idle_producers(self, now: float) -> None:
        """Close the producers idle for as long as a partition takes to turn dormant (`DestinationProducers`)."""
        if closed := self.producers.close_idle(now):
            self._point({group: self._produce_through(group) for group in closed})

    # -- acknowledge ------------------------------------------------------------------------------------

    def acknowledged(self, state: PartitionState, run: InFlight, err: KafkaError | None, msg: Message | None) -> None:
        """The destination acknowledged (or refused) a run's last record, and with it the whole run."""
        self.book.touched += 1
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
        acknowledged = self.metrics.counters_for(state.topic)
        acknowledged.add(run.count, run.size)
        acknowledged.add_latencies(self.now_ms, run.timestamps)
        # (A delivered record's offset is None only without acknowledgements, acks=0, which an ordered state rules out.)
        if msg is not None and state.ordered and (offset := msg.offset()) is not None:
            state.destination_next = offset + 1

    def poll_acks(self, timeout: float, now_ms: int | None = None) -> None:
        """Poll the producers for acknowledgements; a fatal producer error (raised by poll()) is kept in `failure`.
        `now_ms` (ms since the epoch) is the acknowledgement time of what this poll and the next ones bring, taken
        once a loop rather than per acknowledgement (`Forwarder.poll_once`)."""
        if now_ms is not None:
            self.now_ms = now_ms
        try:
            self.producers.poll(timeout)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if not err.fatal():
                raise
            self.failure = self.failure or err

    def drain(self, timeout: float) -> None:
        """Wait until the producer has delivered everything, polling for acknowledgements, and acknowledge the runs
        cut short once it has; a fatal error ends the wait (the loop replaces the producer).

        Not `flush()`: a fatal error raised while confluent-kafka's flush waits comes out as a SystemError or as an
        object no `except` clause catches (a gapless producer whose batch the broker refused does this), where
        `poll()` raises it as the KafkaException `poll_acks` handles."""
        producers = self.producers
        deadline = time.monotonic() + timeout
        while len(producers) and self.failure is None and (left := deadline - time.monotonic()) > 0:
            self.poll_acks(min(left, 0.1))
        if not len(producers) and self.failure is None:
            self.conclude_cut_runs(delivered=True)
        else:
            self.cut_runs = True  # acknowledged by the loop once the producer is empty (or given up with it)

    def acknowledge_cut_runs(self) -> None:
        """The runs cut short, acknowledged if the producer has delivered everything since (see `conclude_cut_runs`)."""
        if self.cut_runs and not len(self.producers):
            self.conclude_cut_runs(delivered=True)

    def conclude_cut_runs(self, delivered: bool) -> None:
        """Runs whose last record carried no callback (cut short by a refusal of the next record, or by an
        interruption): acknowledged once the producer has delivered everything without a fatal error (with gapless
        ordering, or inside a transaction, nothing of them can then be missing); given up otherwise — they stay at
        the head of `pending`, so their partition is re-read from their first offset when it resumes."""
        self.cut_runs = False
        for state in self.book.states.values():
            state.open_run = None
            for run in [r for r in state.pending if not r.tail_sent]:
                run.tail_sent = True
                if delivered:
                    self.acknowledged(state, run, None, None)
                else:
                    state.in_flight -= run.count

    # -- a failed producer ----------------------------------------------------------------------------------

    def failed(self, err: KafkaError) -> None:
        """A record failed because its producer did: the task replaces the producers (`failure`)."""
        self.failure = err

    def take_failure(self) -> KafkaError | None:
        """The producer failure noticed, if any, now being dealt with."""
        err, self.failure = self.failure, None
        return err

    def purge(self) -> None:
        """Drop every record not yet sent; purged records come back as refusals (`refused` leaves their partitions
        to the next producer), polled here for up to 30 s."""
        self.producers.purge()
        deadline = time.monotonic() + 30
        while len(self.producers) and time.monotonic() < deadline:
            self.poll_acks(0.1)

    def close(self) -> None:
        """Close the producers (`DestinationProducers.close`): the task stops, or makes its clients again."""
        self.producers.close()

    def replace_producers(self) -> None:
        """New producers in place of the failed ones, each partition writing through its topic's new producer."""
        self.producers.replace()
        self._point({group: self._produce_through(group) for group in range(len(self.producers.all))})

    def _producer_error(self, err: KafkaError) -> None:
        """librdkafka's error callback: without one, a fatal producer error is raised from poll()."""
        if err.fatal():
            self.failure = self.failure or err
        else:  # transient (a broker down, a connection reset): librdkafka retries by itself
            log.debug("producer of %s: %s", self.name, err.str())
