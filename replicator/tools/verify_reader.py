"""Reading one cluster for a check (`replicator.tools.verify`): a consumer that never joins a group or commits,
reads assigned partitions from the beginning up to the snapshot's bounds (the source) or until every checked record's
copy was seen (the destination), and keeps the cluster's non-fatal errors for the report.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

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
from replicator.tools.verify_ledger import SourceLog, VerifyRun

BATCH_SIZE = 10_000
POLL_TIMEOUT_S = 0.5
METADATA_TIMEOUT_S = 10.0

# Settings the check always overrides: it must never commit, whatever the caller's settings say.
# read_committed: records of aborted transactions (exactly-once mode, or a transactional source) are not records.
_FORCED = {"enable.auto.commit": False, "enable.auto.offset.store": False, "isolation.level": "read_committed"}


class VerifyError(RuntimeError):
    """The check could not run at all (bad client settings, cluster unreachable)."""


class ClusterReader:
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

    def __enter__(self) -> ClusterReader:
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

    def read_snapshot(self, run: VerifyRun, started_at_ms: int, deadline: float, idle_s: float) -> bool:
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

    def _end_quiet_sources(self, run: VerifyRun, idle_s: float) -> None:
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

    def _read_source_record(self, run: VerifyRun, msg: Record, started_at_ms: int) -> bool:
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
        run: VerifyRun,
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


def _next_offset(log: SourceLog) -> int:
    return log.offsets[-1] + 1 if log.offsets else 0
