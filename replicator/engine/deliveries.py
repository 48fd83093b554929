"""Acknowledge: the task's destination producers as its partitions write through them, and what comes back.

  route        `route`: each partition writes through the producer of its destination topic's group
               (`DestinationProducers`, below), to the destination partition of its number
  acknowledge  `acknowledged`: the destination acknowledged (or refused) a run of records (`InFlight`); with an
               idempotent, gapless producer one acknowledgement stands for every earlier record of the partition
  cut runs     runs whose last record carried no callback (a refusal of the next record cut them short) are
               acknowledged once the producer delivered everything (`drain`, `acknowledge_cut_runs`)
  refusals     a refused run (or a record the forwarder could not send) is kept as data, a `Refusal` in
               `refusals`, and its partition skipped until the task loop takes it (`take_refusals`)
  failure      a fatal producer error (raised by poll(), or librdkafka's error callback) is kept in `failure` until
               the task replaces the producers

What a refusal or a failure does is decided by the committer of the task's delivery mode, once a loop (`settle`,
`replicator.engine.committer`), with `replicator.engine.failures`: never from inside a poll.

The producers (`DestinationProducers`): one librdkafka producer per group of destination topics holding up to
`PARTITIONS_PER_PRODUCER` partitions.

Why more than one: a librdkafka producer sends a produce request per partition (its issue #1700) and its broker
thread visits every partition of every topic it knows at each wake-up, so its cost grows with records/s x the
partitions of its topics, and one producer over thousands of evenly loaded partitions falls behind. Splitting a
topic's partitions over producers does not help (each then knows every topic), so a group holds whole topics and a
topic wider than the limit has a producer of its own. The layouts compared: benchmarks/README.md, "Producers per
group of topics".

A partition writes through its topic's producer only (`PartitionState.produce`), so its records stay in order and
one acknowledgement still stands for a run. Exactly-once mode keeps one producer: a transaction spans the task's
partitions, and a transactional id belongs to one producer.

A producer that holds nothing and delivered no acknowledgement for as long as a partition takes to turn dormant is
closed (`close_idle`) and made again at its topics' next record (`open`): an idle producer's threads still wake
several times a second and visit its topics' partitions. The record that reopens one waits for its connection and
metadata, after at least a minute of silence.

A task that stops or makes its clients again closes its producers (`close`): left to Python, a producer is destroyed
only by the cyclic collector (its error callback is a method of the deliveries that hold it), its threads running
and reconnecting meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from replicator.engine.metrics import TaskMetrics
from replicator.engine.partitions import InFlight, PartitionBook, PartitionState

log = logging.getLogger(__name__)

PARTITIONS_PER_PRODUCER = 500
# How long closing a transactional producer waits for its open transaction's abort (`close_producer`).
CLOSE_ABORT_S = 1.0
# What `abort_transaction` answers at once, and `Producer.close()`'s own abort answers alike: no transaction is open,
# or the producer is not transactional.
NO_TRANSACTION = {KafkaError._STATE, KafkaError._NOT_CONFIGURED}


def close_producer(producer: Producer, abort_s: float = CLOSE_ABORT_S) -> bool:
    """Close `producer` now, dropping what it still holds; whether it was closed.

    confluent-kafka's `close()` waits without a limit, first for an open transaction's abort, then for every record
    it holds to be delivered (it takes no timeout). So the records are purged first (their delivery reports, as
    purged, are served by `close()`), and an open transaction is aborted here within `abort_s`. A producer whose
    transaction did not abort in that time (the destination does not answer) is not closed: it is destroyed when
    dropped, and the next `init_transactions` of its transactional.id aborts the transaction."""
    producer.purge()
    try:
        producer.abort_transaction(abort_s)
    except KafkaException as exc:
        err: KafkaError = exc.args[0]
        if err.code() not in NO_TRANSACTION and not err.fatal():  # a fatal error is answered at once, as here
            log.warning("producer left unclosed: its transaction did not abort within %.0fs (%s)", abort_s, err.str())
            return False
    try:
        producer.close()
    except KafkaException as exc:  # destroyed all the same: raised from the purged records' reports (purging records
        # in flight stops a gapless producer with a fatal error)
        log.info("producer closed after an error: %s", exc.args[0])
    return True


class DestinationProducers:
    """The producers, the destination topics each one writes, and what they hold between them."""

    def __init__(self, make: Callable[[], Producer], grouped: bool, idle_close_s: float) -> None:
        self.make = make
        self.limit = PARTITIONS_PER_PRODUCER if grouped else None
        self.idle_close_s = idle_close_s if grouped else None  # exactly-once: its one producer stays
        self.all: list[Producer | None] = [make()]  # None: closed while idle
        self.acked_at = [time.monotonic()]  # when each last delivered an acknowledgement (or was made)
        self.loads = [0]  # destination partitions of the topics given to each producer
        self.topics: dict[str, int] = {}  # destination topic -> its producer's index

    @property
    def first(self) -> Producer:
        """The only producer in exactly-once mode; in any mode, one connected producer (metadata warm-up)."""
        return self.open(0)

    def index_for(self, topic: str, partitions: int) -> int:
        """The group that writes `topic` (of `partitions` partitions): its own, or the first with room for it, or a
        new one."""
        index = self.topics.get(topic)
        if index is None:
            index = next((i for i, load in enumerate(self.loads) if self._fits(load, partitions)), None)
            if index is None:
                self.all.append(self.make())
                self.acked_at.append(time.monotonic())
                self.loads.append(0)
                index = len(self.all) - 1
            self.loads[index] += partitions
            self.topics[topic] = index
            # About to be written: a producer made long before (a standby's, warmed up while it waited) is not idle.
            self.acked_at[index] = time.monotonic()
        return index

    def open(self, index: int) -> Producer:
        """Group `index`'s producer, made again if it was closed while idle."""
        producer = self.all[index]
        if producer is None:
            producer = self.all[index] = self.make()
            self.acked_at[index] = time.monotonic()
        return producer

    def close_idle(self, now: float) -> list[int]:
        """Close every producer that holds no record and delivered no acknowledgement for `idle_close_s`; their
        groups. Whatever still refers to one must stop using it (`Forwarder.close_idle_producers`)."""
        if self.idle_close_s is None:
            return []
        closed = []
        for index, producer in enumerate(self.all):
            if producer is not None and not len(producer) and now - self.acked_at[index] > self.idle_close_s:
                producer.close()
                self.all[index] = None
                closed.append(index)
        return closed

    def _fits(self, load: int, partitions: int) -> bool:
        return self.limit is None or not load or load + partitions <= self.limit

    def __len__(self) -> int:
        """Records produced and not yet acknowledged, by all of them."""
        return sum(len(producer) for producer in self.all if producer is not None)

    def poll(self, timeout: float) -> None:
        """Poll every producer for acknowledgements; wait up to `timeout` only when none had any (on the one with the
        most records outstanding)."""
        acked = False
        for index, producer in enumerate(self.all):
            if producer is not None and producer.poll(0):
                self.acked_at[index] = time.monotonic()
                acked = True
        if not acked and timeout > 0:
            busiest = max((p for p in self.all if p is not None), key=len, default=None)
            if busiest is None:
                time.sleep(timeout)  # all closed: nothing can be acknowledged; the caller waits as it asked
            elif busiest.poll(timeout):
                self.acked_at[self.all.index(busiest)] = time.monotonic()

    def purge(self) -> None:
        for producer in self.all:
            if producer is not None:
                producer.purge()

    def of(self, topic: str) -> Producer | None:
        """The producer writing `topic`, once it was given one (`index_for`) and while it is open."""
        index = self.topics.get(topic)
        return None if index is None else self.all[index]

    def replace(self) -> None:
        """New producers in place of all the open ones (after a fatal error), each writing the same topics as
        before; the old ones are closed."""
        old, self.all = self.all, [None if producer is None else self.make() for producer in self.all]
        for producer in old:
            if producer is not None:
                close_producer(producer)

    def close(self) -> None:
        """Close every producer, dropping the records they still hold (their delivery reports, as purged, are served
        first): a stop drained what it could, and its successor reads the rest again."""
        for index, producer in enumerate(self.all):
            if producer is not None:
                self.all[index] = None
                close_producer(producer)


MAX_BLOCK_S = 1.0  # never block longer: a stop is noticed between two turns of the loop (`should_stop`)
# While records await acknowledgement, the loop waits for new records at most this long, so acknowledgements are
# polled (and their time taken for the latency metric) within a few milliseconds of their arrival.
ACK_POLL_S = 0.005

# Records the task purged from a producer it is replacing (or from an aborted transaction): they are read again,
# they were not refused.
PURGED = {KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT}


class Refusal(NamedTuple):
    """A record the destination refused (`sent`), or that the task refused before producing it, saying `why`."""

    state: PartitionState
    offset: int
    err: KafkaError
    why: str | None = None
    sent: bool = True

    @property
    def purged(self) -> bool:
        return self.err.code() in PURGED


class Deliveries:
    """The destination producers, which one each partition writes through, and their acknowledgements."""

    def __init__(
        self,
        producer_settings: dict[str, Any],
        book: PartitionBook,
        metrics: TaskMetrics,
        *,
        ordered_acks: bool,
        grouped: bool,
        idle_close_s: float,
        name: str,
    ) -> None:
        self.settings = producer_settings  # every producer's, sized for the task's destination topics
        self.book = book
        self.metrics = metrics
        self.refusals: deque[Refusal] = deque()  # taken and decided by the loop (`take_refusals`)
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
        group = self.producers.index_for(state.destination_topic, destination_partitions)
        state.route(partition, self.ordered_acks, self._produce_through(group))

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
                state.write_through(produce_by_group[group])

    def close_idle_producers(self, now: float) -> None:
        """Close the producers idle for as long as a partition takes to turn dormant (`DestinationProducers`)."""
        if closed := self.producers.close_idle(now):
            self._point({group: self._produce_through(group) for group in closed})

    # -- acknowledge ------------------------------------------------------------------------------------

    def acknowledged(self, state: PartitionState, run: InFlight, err: KafkaError | None, msg: Message | None) -> None:
        """The destination acknowledged (or refused) a run's last record, and with it the whole run."""
        self.book.touched += 1
        if err is not None:
            state.unanswered(run)  # the run stays in `pending`: nothing is committed past it
            self.refuse(Refusal(state, run.first, err))
            return
        state.acknowledged(run, msg.offset() if msg is not None else None)
        # Counted into the topic's counters at once: records, bytes and each record's latency (source CreateTime to
        # acknowledgement). Per record, not sampled: a backlog mixes old and new records, and the latency report's
        # buckets (Mirus's 5m … 12h) must count each one where it belongs. A run at a time: no pause to fold a busy
        # second.
        acknowledged = self.metrics.counters_for(state.topic)
        acknowledged.add(run.count, run.size)
        acknowledged.add_latencies(self.now_ms, run.timestamps)

    def refuse(self, refusal: Refusal) -> None:
        """Keep a refusal for the loop to decide; its partition's records are skipped until then. A record purged
        from a producer being replaced (or an aborted transaction) was not refused: it leaves the ledger alone."""
        if not refusal.purged:
            refusal.state.refused(refusal.offset, too_large=refusal.err.code() == KafkaError.MSG_SIZE_TOO_LARGE)
        self.refusals.append(refusal)

    def take_refusals(self) -> list[Refusal]:
        """The refusals kept since the last call, in their order."""
        taken = list(self.refusals)
        self.refusals.clear()
        return taken

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
            for run in state.cut_runs():
                if delivered:
                    self.acknowledged(state, run, None, None)
                else:
                    state.unanswered(run)

    # -- a failed producer ----------------------------------------------------------------------------------

    def failed(self, err: KafkaError) -> None:
        """A record failed because its producer did: the task replaces the producers (`failure`)."""
        self.failure = err

    def take_failure(self) -> KafkaError | None:
        """The producer failure noticed, if any, now being dealt with."""
        err, self.failure = self.failure, None
        return err

    def purge(self) -> None:
        """Drop every record not yet sent; purged records come back as refusals (`Refusal` with a _PURGE_ error),
        polled here for up to 30 s."""
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
