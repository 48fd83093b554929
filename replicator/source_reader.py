"""A task's source consumer, in two tiers: partitions that flow are fetched eagerly, quiet ones cheaply.

librdkafka fixes a consumer's fetch wait when it is created, and every fetch request names every partition the
consumer holds (neither librdkafka nor Apache Kafka before 1.1 has incremental fetch sessions). One setting cannot
serve both kinds of partition:
- flowing (the connector's consumer settings; by default `fetch.wait.max.ms` 3 with `fetch.min.bytes` 1 MB): the
  broker answers within 3 ms, so a record waits at most that long, at up to ~330 fetches a second per broker;
- quiet (no record for `quiet_after_s`): `fetch.wait.max.ms` 500 with `fetch.min.bytes` 1, as MirrorMaker's Java
  consumer fetches: the broker holds the fetch until the first byte arrives, so a new record is answered at once,
  and an idle partition costs two fetches a second per broker instead of 330.
A quiet partition that yields a record keeps being read by the quiet consumer (which answers at the first byte) and
moves back to the flowing tier at the next `settle`; one whose records stop moves to the quiet tier at its next
offset. Stopped means no record read for `quiet_after_s` while the task kept up with the flowing consumer (its queue
emptied after that long): records waiting in the queue behind a busy or stalled loop do not make a partition quiet.
(Measured before that rule, 5,000 partitions at 2,000 records/s: after the loop stalled for 9 s, ~1,900 partitions
moved to the quiet tier in one `settle` and back a few seconds later, each move an unassign and an assign.)
A partition is in exactly one tier; moving it is an unassign from one consumer and an assign at an explicit offset
on the other (librdkafka drops what the first had prefetched).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Consumer, Message, TopicPartition

from replicator.assignment import SourcePartition

QUIET_AFTER_S = 5.0  # a flowing partition without a record for this long moves to the quiet tier
QUIET_SETTINGS = {"fetch.wait.max.ms": 500, "fetch.min.bytes": 1}
# While both tiers hold partitions, a wait for records alternates between them in slices this long.
SLICE_S = 0.01


class SourceReader:
    """The consumer operations the task uses, each applied to the tier that holds the partition."""

    def __init__(self, settings: dict[str, Any], quiet_after_s: float = QUIET_AFTER_S) -> None:
        self.flowing = Consumer(settings)
        self.quiet = Consumer({**settings, **QUIET_SETTINGS})
        self.quiet_after_s = quiet_after_s
        self.tier: dict[SourcePartition, Consumer] = {}
        self.quiet_count = 0
        self.paused: set[SourcePartition] = set()
        self.waking: set[SourcePartition] = set()  # quiet partitions that yielded records since the last `settle`
        # Per flowing partition: its position when last checked, and since when it has not moved.
        self.still_since: dict[SourcePartition, tuple[int | None, float]] = {}
        self.drained_at = time.monotonic()  # when the flowing consumer last had fewer records than asked for

    # -- fetch --------------------------------------------------------------------------------------------

    def consume(self, count: int, timeout: float) -> list[Message]:
        """Records from both tiers (flowing first); waits up to `timeout` for the first one."""
        flowing, quiet = self.flowing, self.quiet
        if not self.quiet_count:
            msgs = flowing.consume(count, timeout)
            if len(msgs) < count:
                self.drained_at = time.monotonic()
            return msgs
        if self.quiet_count == len(self.tier):
            msgs, woken = [], quiet.consume(count, timeout)
            self.drained_at = time.monotonic()  # (nothing flows)
        else:
            msgs, woken = flowing.consume(count, 0), quiet.consume(count, 0)
            deadline = time.monotonic() + timeout
            while not msgs and not woken and (left := deadline - time.monotonic()) > 0:
                msgs = flowing.consume(count, min(left, SLICE_S))
                woken = [] if msgs else quiet.consume(count, 0)
            if len(msgs) < count:
                self.drained_at = time.monotonic()
        if woken:
            for msg in woken:  # they flow again at the next `settle`: one move for all, not one per batch
                self.waking.add((msg.topic(), msg.partition()))
            msgs.extend(woken)
        return msgs

    def settle(self, positions: Callable[[SourcePartition], int | None]) -> None:
        """Move quiet partitions that yielded records back to the flowing tier, and flowing partitions whose position
        has not changed for `quiet_after_s` of reading (see the module's doc) to the quiet tier, each at the task's
        next offset to read (`positions`;
        None if unknown). Called about once a second: librdkafka's assignment changes cost in proportion to every
        partition assigned, so partitions move in one batch each way, never one by one."""
        now = time.monotonic()
        waking = {
            tp: position
            for tp in self.waking
            if self.tier.get(tp) is self.quiet and tp not in self.paused and (position := positions(tp)) is not None
        }
        self.waking = set()
        if waking:
            self._move(list(waking), self.quiet, self.flowing, waking)
        resting: dict[SourcePartition, int] = {}
        for tp, consumer in self.tier.items():
            if consumer is not self.flowing or tp in self.paused:
                continue
            position = positions(tp)
            seen, since = self.still_since.get(tp, (None, now))
            if position != seen or tp not in self.still_since:
                self.still_since[tp] = (position, now)
                continue
            if self.drained_at - since < self.quiet_after_s:
                continue
            if position is None:
                # Nothing read yet: only an empty log has a position that is safe to name (its end).
                low, high = self.flowing.get_watermark_offsets(TopicPartition(*tp), cached=True)
                if high < 0 or low != high:
                    continue
                position = high
            resting[tp] = position
        if resting:
            self._move(list(resting), self.flowing, self.quiet, resting)

    def _move(
        self, partitions: list[SourcePartition], source: Consumer, target: Consumer, offsets: dict[SourcePartition, int]
    ) -> None:
        source.incremental_unassign([TopicPartition(*tp) for tp in partitions])
        target.incremental_assign([TopicPartition(t, p, offsets[(t, p)]) for t, p in partitions])
        for tp in partitions:
            self.tier[tp] = target
            self.still_since.pop(tp, None)
        self.quiet_count += len(partitions) if target is self.quiet else -len(partitions)

    # -- assignment, pause, seek ----------------------------------------------------------------------------

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Start reading `partitions` at their offsets, in the flowing tier."""
        self.flowing.incremental_assign(partitions)
        for tp in partitions:
            self.tier[(tp.topic, tp.partition)] = self.flowing

    def unassign(self, partitions: Iterable[SourcePartition]) -> None:
        for consumer in (self.flowing, self.quiet):
            mine = [tp for tp in partitions if self.tier.get(tp) is consumer]
            if mine:
                consumer.incremental_unassign([TopicPartition(*tp) for tp in mine])
        for tp in partitions:
            if self.tier.pop(tp, None) is self.quiet:
                self.quiet_count -= 1
            self.still_since.pop(tp, None)
            self.paused.discard(tp)

    def pause(self, partitions: Iterable[SourcePartition]) -> None:
        for consumer, mine in self._by_tier(partitions):
            consumer.pause(mine)
        self.paused.update(partitions)

    def resume(self, partitions: Iterable[SourcePartition]) -> None:
        for consumer, mine in self._by_tier(partitions):
            consumer.resume(mine)
        self.paused.difference_update(partitions)

    def seek(self, tp: SourcePartition, offset: int) -> None:
        self.tier[tp].seek(TopicPartition(tp[0], tp[1], offset))

    def watermarks(self, tp: SourcePartition) -> tuple[int, int]:
        """The partition's low and high watermarks as its tier last heard them (no request)."""
        return self.tier[tp].get_watermark_offsets(TopicPartition(*tp), cached=True)

    def list_topics(self, topic: str, timeout: float) -> None:
        """Read `topic`'s metadata now in both tiers (a partition may move to either)."""
        for consumer in (self.flowing, self.quiet):
            consumer.list_topics(topic, timeout=timeout)

    def close(self) -> None:
        self.flowing.close()
        self.quiet.close()

    def _by_tier(self, partitions: Iterable[SourcePartition]) -> list[tuple[Consumer, list[TopicPartition]]]:
        grouped: dict[int, tuple[Consumer, list[TopicPartition]]] = {}
        for tp in partitions:
            consumer = self.tier.get(tp)
            if consumer is not None:
                grouped.setdefault(id(consumer), (consumer, []))[1].append(TopicPartition(*tp))
        return list(grouped.values())
