"""A task's source consumers: partitions that flow are fetched eagerly, quiet ones cheaply, long-silent ones rarely.

librdkafka fixes a consumer's fetch wait when it is created, and every fetch request names every partition the
consumer holds (neither librdkafka nor Apache Kafka before 1.1 has incremental fetch sessions). One setting cannot
read every partition well, so partitions live in three tiers:
- flowing (the connector's consumer settings; by default `fetch.wait.max.ms` 3 with `fetch.min.bytes` 1 MB): a
  record waits at most the fetch wait;
- quiet (no record for `quiet_after_s`): `QUIET_SETTINGS`, as MirrorMaker's Java consumer fetches: the broker holds
  the fetch until the first byte arrives, so a new record is answered at once and an idle partition costs two
  fetches a second per broker;
- dormant (quiet for `dormant_after_s` more): `DORMANT_SETTINGS`, the same waiting up to 10 s. A tier of its own
  because a partition added to a consumer joins its *next* fetch: one that went quiet a moment ago waits for the
  quiet fetch in flight, not 10 s.
A task places the partitions it starts (at its start, a takeover, a new assignment) in the quiet tier, where a
backlog is answered at once, so that a large start does not fetch every partition eagerly and starve the brokers.
A few (`EAGER_START_PARTITIONS`: a new topic, a grown one) start in the flowing tier instead: the quiet consumer's
fetch in flight holds every other request on its connection, so their metadata and first fetch would wait behind
it. Silent, they go quiet at `retier` like any flowing partition. A quiet or dormant partition that yields records
keeps being read where it is (answered at the first byte) and moves to the flowing tier at the next `retier` if it
has a backlog or yielded records at an earlier `retier` less than `quiet_after_s` before: one record, or a start's
few, is no traffic. A flowing partition counts as stopped only while the task keeps up with the flowing consumers
(they returned less than was asked after the partition's last record): records waiting behind a busy or stalled
loop do not make a partition quiet. A partition is in exactly one consumer; moving it is an unassign from one and
an assign at an explicit offset on the other (librdkafka drops what the first had prefetched).

Each tier spreads its partitions over consumers of at most `SHARD_PARTITIONS`: a librdkafka consumer's broker
thread visits every partition it holds at each wake-up, so its cost grows faster than its partitions. A consumer
left empty is closed (but the flowing tier's first): an idle librdkafka client still wakes its threads. What the
tiers cost: benchmarks/README.md, "Holding thousands of partitions".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from replicator.assignment import SourcePartition
from replicator.partition_reader import Record, as_records

log = logging.getLogger(__name__)

QUIET_AFTER_S = 5.0  # a flowing partition without a record for this long moves to the quiet tier
DORMANT_AFTER_S = 60.0  # a quiet partition without a record for this long moves to the dormant tier
QUIET_SETTINGS = {"fetch.wait.max.ms": 500, "fetch.min.bytes": 1}
DORMANT_SETTINGS = {"fetch.wait.max.ms": 10_000, "fetch.min.bytes": 1}
SHARD_PARTITIONS = 2_000
EAGER_START_PARTITIONS = 100  # a start of at most this many partitions is fetched eagerly (flowing tier) at once
# What each consumer prefetches at most, unless the connector sets `consumer.queued.max.messages.kbytes`:
# librdkafka's 64 MB is per consumer, and a task catching up over 10,000 partitions runs five or more of them.
SHARD_QUEUE_KBYTES = 16_384
# While several consumers hold partitions, a wait for records waits on the first in slices this long and polls the
# others between slices; when none of them is flowing, in longer slices: the first record of a waking partition
# may wait that much longer, and idle dormant consumers cost 10 rounds a second instead of 100.
SLICE_S = 0.01
QUIET_SLICE_S = 0.1


@dataclass(frozen=True)
class TierLimits:
    """When partitions change tier, and how many one consumer holds."""

    quiet_after_s: float = QUIET_AFTER_S
    dormant_after_s: float = DORMANT_AFTER_S
    shard_partitions: int = SHARD_PARTITIONS
    eager_start_partitions: int = EAGER_START_PARTITIONS


DEFAULT_LIMITS = TierLimits()


class Shard:
    """One consumer of a tier and how many partitions it holds."""

    __slots__ = ("assigned", "consumer", "tier")

    def __init__(self, tier: Tier) -> None:
        self.tier = tier
        self.consumer = Consumer({"queued.max.messages.kbytes": SHARD_QUEUE_KBYTES, **tier.settings})
        self.assigned = 0  # partitions given to its consumer


class Tier:
    """Consumers of one fetch setting, created as partitions arrive, each holding at most `shard_partitions`."""

    def __init__(self, settings: dict[str, Any], shard_partitions: int) -> None:
        self.settings = settings
        self.shard_partitions = shard_partitions
        self.shards: list[Shard] = []

    def place(self, count: int) -> Iterator[tuple[Shard, int]]:
        """Where `count` new partitions go: the room left in existing consumers first, then new ones."""
        for shard in self.shards:
            if count <= 0:
                return
            if (room := self.shard_partitions - shard.assigned) > 0:
                yield shard, min(room, count)
                count -= room
        while count > 0:
            shard = Shard(self)
            self.shards.append(shard)
            yield shard, min(self.shard_partitions, count)
            count -= self.shard_partitions


class SourceReader:
    """The consumer operations the task uses, each applied to the consumer that holds the partition."""

    def __init__(self, settings: dict[str, Any], limits: TierLimits = DEFAULT_LIMITS) -> None:
        self.flowing = Tier(settings, limits.shard_partitions)
        self.quiet = Tier({**settings, **QUIET_SETTINGS}, limits.shard_partitions)
        self.dormant = Tier({**settings, **DORMANT_SETTINGS}, limits.shard_partitions)
        self.tiers = (self.flowing, self.quiet, self.dormant)
        self.flowing.shards.append(Shard(self.flowing))  # fails now, not at the first assignment, on bad settings
        self.quiet_after_s, self.dormant_after_s = limits.quiet_after_s, limits.dormant_after_s
        self.eager_start_partitions = limits.eager_start_partitions
        self.shard: dict[SourcePartition, Shard] = {}
        self.paused: set[SourcePartition] = set()
        self.waking: set[SourcePartition] = set()  # quiet or dormant partitions that yielded records since `retier`
        self.woke: dict[SourcePartition, float] = {}  # ... when those of them that stayed where they were last did
        # Per flowing partition: its position when last checked, and since when it has not moved; per quiet one,
        # since when it is there.
        self.still_since: dict[SourcePartition, tuple[int | None, float]] = {}
        self.drained_at = time.monotonic()  # when the flowing consumers last returned less than was asked
        # Placed in the flowing tier and not fetched from since, kept only while DEBUG logging is on: when a started
        # partition's first records come is a stage of a reaction (benchmarks/orchestration_latency.py).
        self.unfetched: set[SourcePartition] = set()
        self.behind = False  # a flowing consumer returned all that was asked in this `consume`

    def assigned_in(self, tier: Tier) -> int:
        return sum(shard.assigned for shard in tier.shards)

    # -- fetch --------------------------------------------------------------------------------------------

    def holds_partitions(self) -> bool:
        """Whether any of its consumers has partitions assigned."""
        return any(shard.assigned for tier in self.tiers for shard in tier.shards)

    def consume(self, count: int, timeout: float, until: Callable[[], bool] = lambda: False) -> list[Record]:
        """Records from every consumer holding partitions (flowing first); waits up to `timeout` for the first, or
        while several consumers are waited on in slices, until `until()` says to stop waiting.
        Error events come among them (see `Record`)."""
        active = [shard for tier in self.tiers for shard in tier.shards if shard.assigned]
        self.behind = False
        if len(active) <= 1:
            if not active:
                time.sleep(timeout)
                return []
            msgs = self._read(active[0], count, timeout)
        else:
            first, others = active[0], active[1:]
            msgs = self._read(first, count, 0)
            for shard in others:
                msgs.extend(self._read(shard, count, 0))
            deadline = time.monotonic() + timeout
            slice_s = SLICE_S if first.tier is self.flowing else QUIET_SLICE_S
            while not msgs and (left := deadline - time.monotonic()) > 0 and not until():
                msgs = self._read(first, count, min(left, slice_s))
                for shard in others:
                    msgs.extend(self._read(shard, count, 0))
        if not self.behind:
            self.drained_at = time.monotonic()
        return msgs

    def _read(self, shard: Shard, count: int, timeout: float) -> list[Record]:
        msgs = as_records(shard.consumer.consume(count, timeout))
        if shard.tier is self.flowing:
            self.behind = self.behind or len(msgs) == count
            if self.unfetched and msgs:
                self._first_fetched(msgs)
        elif msgs:
            for msg in msgs:  # they flow again at the next `retier`: one move for all, not one per batch
                self.waking.add((msg.topic(), msg.partition()))
        return msgs

    def retier(self, positions: Callable[[SourcePartition], int | None]) -> None:
        """Move quiet and dormant partitions that yielded records back to the flowing tier, flowing partitions whose
        position has not changed for `quiet_after_s` to the quiet tier, and quiet ones silent for `dormant_after_s`
        to the dormant tier, each at the task's next offset to read (`positions`; None if unknown). Called about once
        a second: librdkafka's assignment changes cost in proportion to every partition assigned, so partitions move
        in one batch each way, never one by one."""
        now = time.monotonic()
        waking = {
            tp: position
            for tp in self.waking
            if (shard := self.shard.get(tp)) is not None
            and shard.tier is not self.flowing
            and tp not in self.paused
            and (position := positions(tp)) is not None
        }
        # Flowing means records less than `quiet_after_s` apart (the flowing tier keeps a partition that long), or a
        # backlog: a partition that yields one record, or a start's few, is read where it is.
        self.woke = {tp: at for tp, at in self.woke.items() if now - at < self.quiet_after_s}
        flowing = {tp: position for tp, position in waking.items() if tp in self.woke or self._behind(tp, position)}
        self.waking = set()
        for tp in waking.keys() - flowing.keys():
            self.woke[tp] = now
            self.still_since[tp] = (waking[tp], now)
        for tp in flowing:
            self.woke.pop(tp, None)
        if flowing:
            self._move(flowing, self.flowing, now)
        resting: dict[SourcePartition, int] = {}
        sleeping: dict[SourcePartition, int] = {}
        for tp, shard in self.shard.items():
            if shard.tier is self.dormant or tp in self.paused:
                continue
            position = positions(tp)
            seen, since = self.still_since.get(tp, (None, now))
            if shard.tier is self.quiet:
                # Placed at `seen`; a partition never read has no position of the task's own.
                if position is not None and position != seen:
                    self.still_since[tp] = (position, now)
                elif now - since >= self.dormant_after_s and seen is not None:
                    sleeping[tp] = seen
                continue
            if position != seen or tp not in self.still_since:
                self.still_since[tp] = (position, now)
                continue
            if self.drained_at - since < self.quiet_after_s:
                continue
            if position is None:
                # Nothing read yet: only an empty log has a position that is safe to name (its end).
                low, high = shard.consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)
                if high < 0 or low != high:
                    continue
                position = high
            resting[tp] = position
        if resting:
            self._move(resting, self.quiet, now)
        if sleeping:
            self._move(sleeping, self.dormant, now)

    def _behind(self, tp: SourcePartition, position: int) -> bool:
        """Whether the partition's log, as its consumer last heard, holds records after `position`."""
        high = self.shard[tp].consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)[1]
        return high > position

    def _move(self, offsets: dict[SourcePartition, int], target: Tier, now: float) -> None:
        partitions = list(offsets)
        self._take_out(partitions)
        self._place(target, [TopicPartition(t, p, offsets[(t, p)]) for t, p in partitions])
        for tp in partitions:
            self.still_since[tp] = (offsets[tp], now)

    def _place(self, tier: Tier, partitions: list[TopicPartition], metadata_timeout: float | None = None) -> None:
        start = 0
        for shard, count in tier.place(len(partitions)):
            mine = partitions[start : start + count]
            start += count
            if metadata_timeout is not None:
                self._read_metadata(shard, sorted({tp.topic for tp in mine}), metadata_timeout)
            shard.consumer.incremental_assign(mine)
            shard.assigned += count
            for tp in mine:
                self.shard[(tp.topic, tp.partition)] = shard
        if partitions and log.isEnabledFor(logging.DEBUG):
            name = ("flowing", "quiet", "dormant")[self.tiers.index(tier)]
            log.debug("%s consumer assigned %d partition(s) of: %s", name, len(partitions), _topics(partitions))
            if tier is self.flowing:
                self.unfetched.update((tp.topic, tp.partition) for tp in partitions)

    def _first_fetched(self, msgs: list[Record]) -> None:
        first = {(msg.topic(), msg.partition()) for msg in msgs} & self.unfetched
        if first:
            self.unfetched -= first
            log.debug("first records fetched of: %s", _topics(TopicPartition(*tp) for tp in first))

    # -- assignment, pause, seek ----------------------------------------------------------------------------

    def assign(
        self, partitions: list[TopicPartition], metadata_timeout: float = 5.0, eager: Collection[SourcePartition] = ()
    ) -> None:
        """Start reading `partitions` at their offsets: a few, or those known to be flowing (`eager`: written to
        after the last commit, as a takeover finds them), in the flowing tier; the others in the quiet tier (a backlog
        is answered there at once, and only the partitions that keep flowing move to eager fetching at `retier`).
        A quiet consumer given many partitions at once sends its first fetch before it holds them all and waits out
        that fetch (500 ms when those are idle) before the others join.

        Each consumer reads the metadata of the topics it is given first (a topic grown or created a moment ago is
        known then, not at librdkafka's next topic scan): before it fetches them, since a request waits behind the
        consumer's fetch in flight (a quiet consumer's long poll, up to 500 ms, on the same connection), so asked
        after, topic by topic, a start of many topics would wait a long poll for each."""
        now = time.monotonic()
        if len(partitions) <= self.eager_start_partitions:
            self._place(self.flowing, partitions, metadata_timeout)
        else:
            first = [tp for tp in partitions if (tp.topic, tp.partition) in eager]
            if first:
                self._place(self.flowing, first, metadata_timeout)
            self._place(
                self.quiet, [tp for tp in partitions if (tp.topic, tp.partition) not in eager], metadata_timeout
            )
        for tp in partitions:  # placed at an explicit offset, or at a logical one its consumer resolves
            self.still_since[(tp.topic, tp.partition)] = (tp.offset if tp.offset >= 0 else None, now)

    def unassign(self, partitions: Iterable[SourcePartition]) -> None:
        partitions = list(partitions)
        self._take_out(partitions)
        for tp in partitions:
            self.shard.pop(tp, None)
            self.still_since.pop(tp, None)
            self.woke.pop(tp, None)
            self.paused.discard(tp)

    def pause(self, partitions: Iterable[SourcePartition]) -> None:
        partitions = list(partitions)
        for shard, mine in self._by_shard(partitions):
            shard.consumer.pause(mine)
        self.paused.update(partitions)

    def resume(self, partitions: Iterable[SourcePartition]) -> None:
        partitions = list(partitions)
        for shard, mine in self._by_shard(partitions):
            shard.consumer.resume(mine)
        self.paused.difference_update(partitions)

    def seek(self, tp: SourcePartition, offset: int) -> None:
        """Read `tp` from `offset` on (a partition not assigned here, on the batch path, has nothing to seek)."""
        if (shard := self.shard.get(tp)) is not None:
            shard.consumer.seek(TopicPartition(tp[0], tp[1], offset))

    def watermarks(self, tp: SourcePartition) -> tuple[int, int]:
        """The partition's low and high watermarks as its consumer last heard them (no request; -1 when it is not
        assigned here)."""
        if (shard := self.shard.get(tp)) is None:
            return -1, -1
        return shard.consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)

    @staticmethod
    def _read_metadata(shard: Shard, topics: list[str], timeout: float) -> None:
        for topic in topics:
            try:
                shard.consumer.list_topics(topic, timeout=timeout)
            except KafkaException as exc:  # only slower: the consumer asks again when it needs to
                log.info("source metadata of %s not read: %s", topic, exc)

    def close(self) -> None:
        for tier in self.tiers:
            for shard in tier.shards:
                shard.consumer.close()

    def _take_out(self, partitions: list[SourcePartition]) -> None:
        """Unassign `partitions` from their consumers, closing those left empty (but the flowing tier's first):
        an idle librdkafka client still wakes its threads."""
        self.unfetched.difference_update(partitions)
        for shard, mine in self._by_shard(partitions):
            shard.consumer.incremental_unassign(mine)
            shard.assigned -= len(mine)
            if not shard.assigned and shard is not self.flowing.shards[0]:
                shard.consumer.close()
                shard.tier.shards.remove(shard)

    def _by_shard(self, partitions: Iterable[SourcePartition]) -> list[tuple[Shard, list[TopicPartition]]]:
        grouped: dict[int, tuple[Shard, list[TopicPartition]]] = {}
        for tp in partitions:
            shard = self.shard.get(tp)
            if shard is not None:
                grouped.setdefault(id(shard), (shard, []))[1].append(TopicPartition(*tp))
        return list(grouped.values())


def _topics(partitions: Iterable[TopicPartition]) -> str:
    return " ".join(sorted({tp.topic for tp in partitions}))
