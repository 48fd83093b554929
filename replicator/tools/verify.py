"""Does the destination hold what the source holds? An operator's check and the test suite's oracle.

Both clusters are read from the beginning with `assign()` (no consumer group is joined and nothing is committed,
so verifying never disturbs anyone's offsets). The check is bounded by a snapshot taken when it starts, so it
ends against live traffic too: each source partition is read up to the end offset the broker reported then
(ListOffsets, as Kafka documents it: the offset the next record will get). A broker whose end offsets contradict
the records it serves (a record at or past the reported end that a fresh query does not account for) has its
end offsets set aside for that partition: reading then stops at the first record created after the check started
(CreateTime), or when the partition stays quiet for `idle_s`, and the report says which bound was used. Each
destination partition is read up to its end offset taken when the check starts, so that every copy written before
then is counted, duplicates after the last source record's copy included, and on until every checked source record
has been seen there; reading stops early only when no copy of one (nor a record below those end offsets) arrived
for `idle_s`. Destination records are attributed to the source record they copy by their provenance headers;
records without them (provenance turned off) are matched by content within the destination partition of the
same number.

Memory stays small for millions of records: per source record only its offset, a 64-bit hash of key, value and
user headers, its timestamp and a delivery counter are kept (about 25 bytes); destination records are checked
as they stream by and then dropped.

(Over 500 lines on purpose: the source log, the destination's attribution and the cluster reader share the compact
per-record arrays above; apart, each would reach into the others'. What a check found is `verify_report.py`.)
"""

from __future__ import annotations

import hashlib
import time
import uuid
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from replicator.clusters import log_offsets
from replicator.configuration.masking import redact_settings
from replicator.partition_reader import Record, as_records
from replicator.tools.verify_report import DestinationResult, Mismatch, PartitionResult, Replay, VerifyReport
from replicator.topics import provenance

SAMPLE_SIZE = 10
"""How many missing or mismatched offsets a report lists per partition (the counts are always complete)."""
MAX_REPLAYS = 1000
"""How many replays a report lists per partition."""

BATCH_SIZE = 10_000
POLL_TIMEOUT_S = 0.5
METADATA_TIMEOUT_S = 10.0

# Which parts of a copy differ from its source record (bit flags, kept per source record in a bytearray).
_CONTENT = 1
_TIMESTAMP = 2
_IS_ZERO = bytes([1] + [0] * 255)  # translate table: zero bytes become 1, all others 0
_DIFFERENCE = {_CONTENT: "content", _TIMESTAMP: "timestamp", _CONTENT | _TIMESTAMP: "content and timestamp"}

# Settings the check always overrides: it must never commit, whatever the caller's settings say.
# read_committed: records of aborted transactions (exactly-once mode, or a transactional source) are not records.
_FORCED = {"enable.auto.commit": False, "enable.auto.offset.store": False, "isolation.level": "read_committed"}


class VerifyError(RuntimeError):
    """The check could not run at all (bad client settings, cluster unreachable)."""


def verify_replication(
    source: Mapping[str, str],
    destination: Mapping[str, str],
    topics: Mapping[str, str],
    *,
    timeout_s: float = 60.0,
    idle_s: float = 3.0,
) -> VerifyReport:
    """Compare every partition of each source topic in `topics` with its destination topic.

    `source` and `destination` are librdkafka client settings (secrets in them are never put in messages).
    Each source partition is read up to the snapshot described in the module docstring; the destination up to
    its end offsets at the start and until every checked record was seen, or no copy of one arrived for `idle_s`.
    `timeout_s` bounds the whole check, and a check cut short by it reports `complete=False`.
    """
    if not topics:
        raise ValueError("no topics to verify: an empty check would report OK without looking at anything")
    started = time.monotonic()
    started_at_ms = int(time.time() * 1000)
    deadline = started + timeout_s
    run = _Run(topics)

    with _ClusterReader("destination", destination) as copies:
        assigned: list[tuple[str, int]] = []
        for topic in sorted(set(topics.values())):
            partitions = copies.partitions(topic, deadline)
            run.destinations[topic] = DestinationResult(
                topic, exists=partitions is not None, partitions=partitions or 0
            )
            assigned += [(topic, p) for p in range(partitions or 0)]
        # Before the source is read: copies written since are counted only while a source record awaits its copy.
        ends = copies.log_ends(assigned)
        run.notes += [
            f"destination {t}[{p}]: no end offset: read until every checked record's copy was seen, so copies after "
            "that may go uncounted"
            for t, p in assigned
            if (t, p) not in ends
        ]

        with _ClusterReader("source", source) as reader:
            for topic in sorted(set(topics)):
                partitions = reader.partitions(topic, deadline)
                if partitions is None:
                    run.complete = False
                    run.notes.append(f"source topic {topic} does not exist: it was not verified")
                    continue
                for p in range(partitions):
                    run.sources[(topic, p)] = _SourceLog(topic, p, topics[topic])
            if not reader.read_snapshot(run, started_at_ms, deadline, idle_s):
                run.timed_out("source", timeout_s)
        run.read_errors("source", reader.errors)

        for log in run.sources.values():
            log.start_matching()
        if not copies.read_copies(assigned, ends, run, deadline, idle_s):
            run.timed_out("destination", timeout_s)
    run.read_errors("destination", copies.errors)
    return run.report(time.monotonic() - started)


# -- the bookkeeping ---------------------------------------------------------------------------------------


class _SourceLog:
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

    def deliver(self, stream: tuple[str, int], i: int, content: int, timestamp: int) -> None:
        """Record one copy of source record `i` seen in destination partition `stream`."""
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
                    self.replays.append(Replay(offset, highest))
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


class _Run:
    """The state of one check: source logs filled first, then destination records attributed as they stream."""

    def __init__(self, topics: Mapping[str, str]) -> None:
        self.topics = dict(topics)
        self.sources: dict[tuple[str, int], _SourceLog] = {}
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

        if origin is None:
            for source_topic in self._feeds[topic]:
                log = self.sources.get((source_topic, partition))
                i = log.index_by_content(content, timestamp) if log is not None else None
                if log is not None and i is not None:
                    dest.content_matched += 1
                    log.content_matched += 1
                    log.deliver((topic, partition), i, content, timestamp)
                    return True
            dest.unmatched += 1
            return False

        log = self.sources.get((origin.source_topic, origin.source_partition))
        if log is None or self.topics.get(origin.source_topic) != topic:
            dest.foreign += 1
            return False
        if log.checked_until is not None and origin.source_offset >= log.checked_until:
            log.after_snapshot += 1
            return False
        i = log.index_of(origin.source_offset)
        if i is None:
            log.unknown += 1
            return False
        if partition != origin.source_partition:
            log.elsewhere += 1
        log.deliver((topic, partition), i, content, timestamp)
        return True

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


# -- reading a cluster -------------------------------------------------------------------------------------


class _ClusterReader:
    """A consumer on one cluster that reads assigned partitions from the beginning until they go quiet."""

    def __init__(self, side: str, settings: Mapping[str, str]) -> None:
        self.side = side
        self.settings = dict(settings)
        self.errors: list[str] = []
        config: dict[str, object] = {
            "group.id": f"mirus-verify-{uuid.uuid4().hex[:12]}",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            **self.settings,
            **_FORCED,
        }
        try:
            self.consumer = Consumer(config)
        except (KafkaException, ValueError, TypeError) as exc:
            raise VerifyError(f"{side} client settings rejected: {self._redact(str(exc))}") from None

    def __enter__(self) -> _ClusterReader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.consumer.close()

    def partitions(self, topic: str, deadline: float) -> int | None:
        """The topic's partition count, or None if it does not exist."""
        timeout = max(1.0, min(METADATA_TIMEOUT_S, deadline - time.monotonic()))
        try:
            metadata = self.consumer.list_topics(topic, timeout=timeout)
        except KafkaException as exc:
            raise VerifyError(f"{self.side} cluster: no metadata for {topic}: {self._redact(str(exc))}") from None
        found = metadata.topics.get(topic)
        if found is None or (found.error is not None and found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            return None
        if found.error is not None:
            raise VerifyError(f"{self.side} cluster: metadata for {topic}: {self._redact(found.error.str())}")
        return len(found.partitions)

    def read_snapshot(self, run: _Run, started_at_ms: int, deadline: float, idle_s: float) -> bool:
        """Read every source partition of `run` up to its snapshot bound; False if the deadline came first."""
        logs = run.sources
        if not logs:
            return True
        ends = self._end_offsets(list(logs), deadline, run.notes)
        for tp, log in logs.items():
            low, log.end = ends.get(tp, (0, None))
            if log.end is not None and log.end <= low:
                log.finish(log.end, f"end offset {log.end} (empty)")
        # Quiet means no partition still being read delivered anything: a partition waiting while the consumer
        # is busy fetching another one's backlog is not quiet.
        last_progress = time.monotonic()
        self.consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in logs])
        try:
            while not all(log.done for log in logs.values()):
                now = time.monotonic()
                if now >= deadline:
                    return False
                if now - last_progress >= idle_s:
                    self._end_quiet_sources(run, idle_s)
                wait = max(0.01, min(POLL_TIMEOUT_S, deadline - now))
                for msg in self._consume(wait):
                    if self._read_source_record(run, msg, started_at_ms):
                        last_progress = time.monotonic()
            return True
        finally:
            for log in logs.values():
                if not log.done:
                    log.finish(_next_offset(log), "timeout")
            self.consumer.unassign()

    def _end_quiet_sources(self, run: _Run, idle_s: float) -> None:
        """No partition still being read delivered anything for `idle_s`: each ends where it is (quiet without an
        end offset, at its end offset when the last offsets hold transaction markers, or else stalled)."""
        for tp, log in run.sources.items():
            if log.done:
                continue
            if log.end is None:
                log.finish(_next_offset(log), f"quiet for {idle_s:g}s")
            elif self._position(tp) >= log.end:  # the last offsets hold transaction markers
                log.finish(log.end, f"end offset {log.end}")
            else:
                run.complete = False
                run.notes.append(
                    f"source {tp[0]}[{tp[1]}]: the broker reported end offset {log.end} but no record past "
                    f"offset {_next_offset(log) - 1} arrived for {idle_s:g}s: the rest was not checked"
                )
                log.finish(_next_offset(log), f"offset {_next_offset(log)} (stalled)")

    def _read_source_record(self, run: _Run, msg: Record, started_at_ms: int) -> bool:
        """Take a record read from the source into its partition's log, up to the snapshot bound; True if it was
        progress (a record of a partition still being read, or the one that ends it)."""
        tp = (msg.topic(), msg.partition())
        log = run.sources.get(tp)
        if log is None:
            return False
        offset = msg.offset()
        if log.done and (log.end is None or log.end_confirmed or offset != log.checked_until == log.end):
            return False  # past a bound already settled; only the record right after the end is checked
        if log.end is not None and offset >= log.end:
            # Kafka: a served record is always below the end offset. A record past the snapshot's end
            # was produced since if the broker now reports an end past it; otherwise its ends are wrong.
            if log.end_confirmed or self._end_confirmed(tp, offset):
                log.end_confirmed = True
                if not log.done:
                    log.finish(log.end, f"end offset {log.end}")
                return False
            run.notes.append(
                f"source {tp[0]}[{tp[1]}]: the broker reported end offset {log.end} but served offset "
                f"{offset} and still reports no more: its end offsets are not usable, so this partition "
                "was read up to the first record created after the check started, or until quiet"
            )
            log.end, log.checked_until = None, None
        timestamp_type, timestamp = msg.timestamp()
        if log.end is None and timestamp_type != TIMESTAMP_NOT_AVAILABLE and timestamp > started_at_ms:
            log.finish(offset, "first record created after the check started")
            return True
        run.add_source(msg)
        if log.end is not None and offset >= log.end - 1:
            log.finish(log.end, f"end offset {log.end}")
        return True

    def read_copies(
        self,
        partitions: list[tuple[str, int]],
        ends: Mapping[tuple[str, int], tuple[int, int]],
        run: _Run,
        deadline: float,
        idle_s: float,
    ) -> bool:
        """Read destination partitions up to their `ends` (first and end offset, from `log_ends`) and until every
        checked source record was seen, or until no copy of one arrived for `idle_s` (records below the end offsets
        count as progress too: a backlog of unrelated records is read through). False if the deadline came first."""
        if not partitions:
            return True
        unread = {tp: end for tp, (first, end) in ends.items() if end > first}
        self.consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in partitions])
        try:
            last_progress = time.monotonic()
            while True:
                now = time.monotonic()
                if now - last_progress >= idle_s or (run.all_delivered() and not self._short_of(unread)):
                    return True
                if now >= deadline:
                    return False
                wait = max(0.01, min(POLL_TIMEOUT_S, deadline - now, last_progress + idle_s - now))
                for msg in self._consume(wait):
                    tp, offset = (msg.topic(), msg.partition()), msg.offset()
                    end = unread.get(tp)
                    if end is not None and offset >= end - 1:
                        del unread[tp]
                    copied = run.add_destination(msg)
                    if copied or offset < ends.get(tp, (0, 0))[1]:
                        last_progress = time.monotonic()
        finally:
            self.consumer.unassign()

    def log_ends(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """Each partition's first offset and end offset now (ListOffsets, one request per broker each; the end is
        the last stable offset, as far as a read_committed consumer reads); a partition whose query failed is left
        out."""
        if not partitions:
            return {}
        try:
            admin = AdminClient(dict(self.settings))
        except (KafkaException, ValueError, TypeError) as exc:
            raise VerifyError(f"{self.side} client settings rejected: {self._redact(str(exc))}") from None
        firsts = log_offsets(admin, partitions, latest=False)
        ends = log_offsets(admin, partitions, latest=True, read_committed=True)
        return {tp: (firsts.get(tp, 0), end) for tp, end in ends.items()}

    def _short_of(self, unread: dict[tuple[str, int], int]) -> bool:
        """Whether a partition is still short of its end offset; one whose position reached it is done (its last
        offsets hold transaction markers or aborted records, which a read_committed consumer never returns)."""
        if unread:
            for position in self.consumer.position([TopicPartition(*tp) for tp in unread]):
                if position.offset >= unread[(position.topic, position.partition)]:
                    del unread[(position.topic, position.partition)]
        return bool(unread)

    def _consume(self, wait: float) -> list[Record]:
        """A batch of records; non-fatal errors are kept for the report, fatal ones end the check."""
        records = []
        for msg in as_records(self.consumer.consume(num_messages=BATCH_SIZE, timeout=wait)):
            error = msg.error()
            if error is None:
                records.append(msg)
            elif error.fatal():
                raise VerifyError(f"{self.side} cluster: {self._redact(error.str())}")
            else:
                note = self._redact(error.str())
                if note not in self.errors:
                    self.errors.append(note)
        return records

    def _end_offsets(
        self, partitions: list[tuple[str, int]], deadline: float, notes: list[str]
    ) -> dict[tuple[str, int], tuple[int, int]]:
        """Each partition's first and end offset now (ListOffsets); a partition whose query failed is left out."""
        ends = {}
        for topic, partition in partitions:
            timeout = max(1.0, min(METADATA_TIMEOUT_S, deadline - time.monotonic()))
            try:
                low, high = self.consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
            except KafkaException as exc:
                notes.append(
                    f"{self.side} {topic}[{partition}]: no end offset ({self._redact(str(exc))}): read up to the "
                    "first record created after the check started, or until quiet"
                )
                continue
            ends[(topic, partition)] = (low, high)
        return ends

    def _end_confirmed(self, tp: tuple[str, int], offset: int) -> bool:
        """Whether the broker now reports an end past `offset` (Kafka: a served record is always below it)."""
        try:
            _low, high = self.consumer.get_watermark_offsets(TopicPartition(*tp), timeout=METADATA_TIMEOUT_S)
        except KafkaException:
            return False
        return high > offset

    def _position(self, tp: tuple[str, int]) -> int:
        (position,) = self.consumer.position([TopicPartition(*tp)])
        return position.offset

    def _redact(self, text: str) -> str:
        """librdkafka quotes rejected values in its messages: never let a password reach a log."""
        return redact_settings(text, self.settings)


# -- small pure helpers ------------------------------------------------------------------------------------


def _next_offset(log: _SourceLog) -> int:
    return log.offsets[-1] + 1 if log.offsets else 0


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
