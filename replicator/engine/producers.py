"""The task's destination producers: one librdkafka producer per group of destination topics holding up to
`PARTITIONS_PER_PRODUCER` partitions.

Why more than one: a librdkafka producer sends a produce request per partition (its issue #1700) and its broker
thread visits every partition of every topic it knows at each wake-up, so its cost grows with records/s x the
partitions of its topics. Measured on Apache Kafka (benchmarks/README.md, "Producers per group of topics"): one
record to each of 10,000 partitions (20 topics x 500) took one producer 6-7 s of a core, twenty producers of one
topic each 0.9 s; at 2,000 records/s spread over them, one producer fell behind at a whole core, twenty kept up at
a third of one. Splitting a topic's partitions over producers does not help (each then knows every topic: the
dearest layout measured), so a group holds whole topics and a topic wider than the limit has a producer of its own.

A partition writes through its topic's producer only (`PartitionState.produce`), so its records stay in order and
one acknowledgement still stands for a run. Exactly-once mode keeps one producer: a transaction spans the task's
partitions, and a transactional id belongs to one producer.
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import Producer

PARTITIONS_PER_PRODUCER = 500


class DestinationProducers:
    """The producers, the destination topics each one writes, and what they hold between them."""

    def __init__(self, make: Callable[[], Producer], grouped: bool) -> None:
        self.make = make
        self.limit = PARTITIONS_PER_PRODUCER if grouped else None
        self.all: list[Producer] = [make()]
        self.loads = [0]  # destination partitions of the topics given to each producer
        self.topics: dict[str, int] = {}  # destination topic -> its producer's index

    @property
    def first(self) -> Producer:
        """The only producer in exactly-once mode; in any mode, one connected producer (metadata warm-up)."""
        return self.all[0]

    def for_topic(self, topic: str, partitions: int) -> Producer:
        """The producer that writes `topic` (of `partitions` partitions): its group's, or the first group with room
        for it, or a new one."""
        index = self.topics.get(topic)
        if index is None:
            index = next((i for i, load in enumerate(self.loads) if self._fits(load, partitions)), None)
            if index is None:
                self.all.append(self.make())
                self.loads.append(0)
                index = len(self.all) - 1
            self.loads[index] += partitions
            self.topics[topic] = index
        return self.all[index]

    def _fits(self, load: int, partitions: int) -> bool:
        return self.limit is None or not load or load + partitions <= self.limit

    def __len__(self) -> int:
        """Records produced and not yet acknowledged, by all of them."""
        return sum(len(producer) for producer in self.all)

    def poll(self, timeout: float) -> None:
        """Serve every producer's acknowledgements; wait up to `timeout` only when none had any (on the one with the
        most records outstanding)."""
        if len(self.all) == 1:
            self.all[0].poll(timeout)
            return
        served = 0
        for producer in self.all:
            served += producer.poll(0)
        if not served and timeout > 0:
            max(self.all, key=len).poll(timeout)

    def purge(self) -> None:
        for producer in self.all:
            producer.purge()

    def of(self, topic: str) -> Producer | None:
        """The producer writing `topic`, once it was given one (`for_topic`)."""
        index = self.topics.get(topic)
        return None if index is None else self.all[index]

    def replace(self) -> None:
        """New producers in place of all of them (after a fatal error), each writing the same topics as before."""
        self.all = [self.make() for _ in self.all]
