"""The bookkeeping of one check (`replicator.tools.verify`): each source partition's records as read, in compact
per-record arrays (offset, a 64-bit hash of key, value and user headers, timestamp, a delivery counter), and the
attribution of each destination record to the source record it copies: by provenance headers, by the copy segments
of record batches copied without them, or by content.
"""

from __future__ import annotations

import hashlib
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping
from typing import Any

from replicator.partition_reader import Record
from replicator.state.records import CopySegment
from replicator.tools.verify_report import DestinationResult, Mismatch, PartitionResult, Replay, VerifyReport
from replicator.topics import provenance

SAMPLE_SIZE = 10
"""How many missing or mismatched offsets a report lists per partition (the counts are always complete)."""
MAX_REPLAYS = 1000
"""How many replays a report lists per partition."""

# Which parts of a copy differ from its source record (bit flags, kept per source record in a bytearray).
_CONTENT = 1
_TIMESTAMP = 2
_IS_ZERO = bytes([1] + [0] * 255)  # translate table: zero bytes become 1, all others 0
_DIFFERENCE = {_CONTENT: "content", _TIMESTAMP: "timestamp", _CONTENT | _TIMESTAMP: "content and timestamp"}


class SourceLog:
    """One source partition as read, and what the destination holds of it.

    Parallel arrays indexed by the record's position in the partition keep this compact; `delivered` counts
    copies (saturating at 255), `differs` flags copies that are not equal to their source record.
    """

    def __init__(self, topic: str, partition: int, destination_topic: str) -> None:
        self.topic = topic
        self.partition = partition
        self.destination_topic = destination_topic
        self.offsets = array("q")
        self.hashes = array("Q")
        self.timestamps = array("q")
        self.delivered = bytearray()
        self.differs = bytearray()
        self.out_of_order = 0
        self.out_of_order_offsets: list[int] = []
        self.elsewhere = 0
        self.unknown = 0
        self.content_matched = 0
        self.after_snapshot = 0
        self.undelivered = 0
        self.end: int | None = None  # the snapshot's end offset while it is trusted
        self.end_confirmed = False  # a record past `end` was served and a fresh query accounted for it
        self.checked_until: int | None = None  # first offset not checked, once reading stopped
        self.bound = "not read"  # where reading stopped and why, for the report
        self.replays: list[Replay] = []
        # Per destination partition: [previous source offset, highest source offset, end of a replay or -1].
        self._streams: dict[tuple[str, int], list[int]] = {}
        self._by_content: dict[int, int | list[int]] | None = None

    def add(self, offset: int, content: int, timestamp: int) -> None:
        self.offsets.append(offset)
        self.hashes.append(content)
        self.timestamps.append(timestamp)

    def start_matching(self) -> None:
        self.delivered = bytearray(len(self.offsets))
        self.differs = bytearray(len(self.offsets))
        self.undelivered = len(self.offsets)

    @property
    def done(self) -> bool:
        return self.checked_until is not None

    def finish(self, checked_until: int, bound: str) -> None:
        self.checked_until = checked_until
        self.bound = bound

    def index_of(self, offset: int) -> int | None:
        offsets = self.offsets
        if not offsets:
            return None
        i = offset - offsets[0]
        if 0 <= i < len(offsets) and offsets[i] == offset:  # the usual case: no gaps (no compaction, no txn)
            return i
        i = bisect_left(offsets, offset)
        return i if i < len(offsets) and offsets[i] == offset else None

    def index_by_content(self, content: int, timestamp: int) -> int | None:
        """The source record a copy without provenance stands for: the first equal one not delivered yet.

        Built on first use only, because only destinations with provenance turned off need it.
        """
        if self._by_content is None:
            self._by_content = {}
            for i, (h, ts) in enumerate(zip(self.hashes, self.timestamps, strict=True)):
                key = _content_key(h, ts)
                seen = self._by_content.get(key)
                if seen is None:
                    self._by_content[key] = i
                elif isinstance(seen, int):
                    self._by_content[key] = [seen, i]
                else:
                    seen.append(i)
        found = self._by_content.get(_content_key(content, timestamp))
        if found is None or isinstance(found, int):
            return found
        return next((i for i in found if not self.delivered[i]), found[-1])

    def deliver(self, stream: tuple[str, int], at: int, i: int, content: int, timestamp: int) -> None:
        """Record one copy of source record `i` seen in destination partition `stream` at offset `at`."""
        offset = self.offsets[i]
        delivered_before = self.delivered[i] > 0
        if not delivered_before:
            self.undelivered -= 1
        if self.delivered[i] < 255:
            self.delivered[i] += 1
        difference = (_CONTENT if self.hashes[i] != content else 0) | (
            _TIMESTAMP if self.timestamps[i] != timestamp else 0
        )
        self.differs[i] |= difference

        state = self._streams.get(stream)
        if state is None:
            self._streams[stream] = [offset, offset, -1]
            return
        previous, highest, replay_end = state
        if offset < previous:
            if not delivered_before:
                self._out_of_order(offset)
                replay_end = -1
            else:
                if len(self.replays) < MAX_REPLAYS:
                    self.replays.append(Replay(offset, highest, at))
                if replay_end < 0:
                    replay_end = highest  # a restart re-sending what was delivered: fine while it stays exact
        elif replay_end >= 0:
            if offset > replay_end:
                replay_end = -1
            elif not delivered_before:
                # The replay brought a record that had been skipped: it arrived after higher offsets.
                self._out_of_order(offset)
                replay_end = -1
        state[:] = [offset, max(highest, offset), replay_end]

    def _out_of_order(self, offset: int) -> None:
        self.out_of_order += 1
        if len(self.out_of_order_offsets) < SAMPLE_SIZE:
            self.out_of_order_offsets.append(offset)

    def result(self) -> PartitionResult:
        delivered = self.delivered
        missing = delivered.count(0)
        missing_offsets = [self.offsets[i] for i in _first_zeros(delivered, SAMPLE_SIZE)]
        mismatched_at = _first_zeros(self.differs.translate(_IS_ZERO), SAMPLE_SIZE)
        return PartitionResult(
            source_topic=self.topic,
            source_partition=self.partition,
            destination_topic=self.destination_topic,
            source_records=len(self.offsets),
            replicated=len(delivered) - missing,
            missing=missing,
            missing_offsets=missing_offsets,
            duplicated=len(delivered) - missing - delivered.count(1),
            out_of_order=self.out_of_order,
            out_of_order_offsets=list(self.out_of_order_offsets),
            elsewhere=self.elsewhere,
            mismatched=len(self.differs) - self.differs.count(0),
            mismatched_offsets=[Mismatch(self.offsets[i], _DIFFERENCE[self.differs[i]]) for i in mismatched_at],
            unknown=self.unknown,
            content_matched=self.content_matched,
            after_snapshot=self.after_snapshot,
            bound=self.bound,
            replays=list(self.replays),
        )


class VerifyRun:
    """The state of one check: source logs filled first, then destination records attributed as they stream.

    `segments`: where copies made as record batches are (`Store.load_segments`); a destination record without
    provenance headers that one of them holds stands for its source record, as if its header named it."""

    def __init__(self, topics: Mapping[str, str], segments: Iterable[CopySegment] = ()) -> None:
        self.topics = dict(topics)
        # Per destination partition: its segments' first offsets, ascending, and the segments.
        self._segments: dict[tuple[str, int], tuple[list[int], list[CopySegment]]] = {}
        for segment in sorted(segments, key=lambda g: g.destination_start):
            starts, held = self._segments.setdefault(
                (segment.destination_topic, segment.destination_partition), ([], [])
            )
            starts.append(segment.destination_start)
            held.append(segment)
        self.sources: dict[tuple[str, int], SourceLog] = {}
        self.destinations: dict[str, DestinationResult] = {}
        self.complete = True
        self.notes: list[str] = []
        self._feeds: dict[str, list[str]] = {}
        for src, dst in sorted(self.topics.items()):
            self._feeds.setdefault(dst, []).append(src)

    def add_source(self, msg: Record) -> None:
        content = _content_hash(msg.key(), msg.value(), provenance.user_headers(msg.headers()))
        self.sources[(msg.topic(), msg.partition())].add(msg.offset(), content, msg.timestamp()[1])

    def all_delivered(self) -> bool:
        return all(log.undelivered == 0 for log in self.sources.values())

    def add_destination(self, msg: Record) -> bool:
        """Attribute one destination record; True if it is a copy of a checked source record."""
        topic, partition = msg.topic(), msg.partition()
        dest = self.destinations[topic]
        dest.records += 1
        headers = msg.headers()
        content = _content_hash(msg.key(), msg.value(), provenance.user_headers(headers))
        timestamp = msg.timestamp()[1]
        origin = provenance.parse(headers)
        source: tuple[str, int, int] | None = None
        if origin is not None:
            source = (origin.source_topic, origin.source_partition, origin.source_offset)
        elif (source := self._segment_source(topic, partition, msg.offset())) is not None:
            dest.by_segments += 1
        if source is None:
            for source_topic in self._feeds[topic]:
                log = self.sources.get((source_topic, partition))
                i = log.index_by_content(content, timestamp) if log is not None else None
                if log is not None and i is not None:
                    dest.content_matched += 1
                    log.content_matched += 1
                    log.deliver((topic, partition), msg.offset(), i, content, timestamp)
                    return True
            dest.unmatched += 1
            return False

        source_topic, source_partition, source_offset = source
        log = self.sources.get((source_topic, source_partition))
        if log is None or self.topics.get(source_topic) != topic:
            dest.foreign += 1
            return False
        if log.checked_until is not None and source_offset >= log.checked_until:
            log.after_snapshot += 1
            return False
        i = log.index_of(source_offset)
        if i is None:
            log.unknown += 1
            return False
        if partition != source_partition:
            log.elsewhere += 1
        log.deliver((topic, partition), msg.offset(), i, content, timestamp)
        return True

    def _segment_source(self, topic: str, partition: int, offset: int) -> tuple[str, int, int] | None:
        """The source record (topic, partition, offset) a segment says the copy at `offset` stands for."""
        starts, held = self._segments.get((topic, partition), ((), ()))
        i = bisect_right(starts, offset) - 1
        if i < 0 or offset >= held[i].destination_start + held[i].count:
            return None
        segment = held[i]
        return segment.topic, segment.partition, segment.source_start + offset - segment.destination_start

    def timed_out(self, side: str, timeout_s: float) -> None:
        self.complete = False
        self.notes.append(
            f"{side} records were still arriving when the {timeout_s:g}s timeout passed: counts are not final"
        )

    def read_errors(self, side: str, errors: list[str]) -> None:
        """A consumer error may have stopped a partition early, and the idle rule cannot tell: not final."""
        if errors:
            self.complete = False
            self.notes += [f"{side} cluster reported while reading (counts may not be final): {e}" for e in errors]

    def report(self, elapsed_s: float) -> VerifyReport:
        notes = list(self.notes)
        for dest in self.destinations.values():
            if not dest.exists:
                notes.append(f"destination topic {dest.topic} does not exist")
            if dest.content_matched or dest.unmatched:
                notes.append(
                    f"content matching was used for {dest.content_matched + dest.unmatched} record(s) of "
                    f"{dest.topic} without provenance headers: each was matched by key, value, headers and "
                    "timestamp to the source partition of the same number, so a changed record shows as missing "
                    "plus unmatched rather than mismatched"
                )
        partitions = [self.sources[key].result() for key in sorted(self.sources)]
        destinations = [self.destinations[t] for t in sorted(self.destinations)]
        return VerifyReport(partitions, destinations, self.complete, notes, elapsed_s)


def _content_hash(key: bytes | None, value: bytes | None, headers: Iterable[tuple[str, bytes | None]]) -> int:
    """A 64-bit fingerprint of what a consumer sees; lengths are hashed too so that fields cannot run together."""
    h = hashlib.blake2b(digest_size=8)
    _feed(h, key)
    _feed(h, value)
    for name, header_value in headers:
        _feed(h, name.encode())
        _feed(h, header_value)
    return int.from_bytes(h.digest(), "big")


def _feed(h: Any, data: bytes | None) -> None:
    if data is None:
        h.update(b"\xff\xff\xff\xff")
    else:
        h.update(len(data).to_bytes(4, "big"))
        h.update(data)


def _content_key(content: int, timestamp: int) -> int:
    return (content ^ (timestamp * 0x9E3779B97F4A7C15)) & 0xFFFF_FFFF_FFFF_FFFF


def _first_zeros(flags: bytes | bytearray, limit: int) -> list[int]:
    """Positions of the first `limit` zero bytes, found in C: a scan in Python would cost seconds at millions."""
    found: list[int] = []
    i = flags.find(0)
    while i >= 0 and len(found) < limit:
        found.append(i)
        i = flags.find(0, i + 1)
    return found
