"""The task's destination producers: one librdkafka producer per group of destination topics holding up to
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
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException, Producer

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
