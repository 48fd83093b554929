"""Exact consumer-group offset translation for failover (MirrorMaker 2's checkpoints, without the approximation).

Every copy carries `mirus.source` = `<source cluster id>/<topic>/<partition>/<offset>` and lands in the
destination partition with its source partition's number, in source-offset order; after a replicator restart a
stretch may be written twice (at-least-once). A group that committed source offset O (it has processed every
record before O) therefore resumes at

    D = 1 + the last destination offset holding a copy of a record of that source partition with offset < O

(or at the start of the destination partition when there is none). From D on, the destination holds exactly the
records from O onwards: nothing the group has not processed is skipped, nothing it processed is read again. The
search reads the destination partition (from the group's previous checkpoint on, when it had one), so it works on
brokers whose high watermarks cannot be trusted; it stops at the partition's end. Copies made as record batches
(shallow mirroring) carry no header: Postgres keeps where they are (`copy_segments`, committed with the offsets),
and the same D is found there; an O between two segments (records compacted away) resumes at the next copy.

Translations are kept as checkpoints in Postgres (`checkpoints`), so a failover after the source cluster is lost
still has the last ones. With `sync.group.offsets.enabled`, they are also committed into the destination group of
the same name, only while that group has no active members and only forward (a consumer that already moved on at
the destination is never sent back), as MM2 does.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from replicator.assignment import SourcePartition
from replicator.clusters import ClusterAdmin
from replicator.configuration.connector import ConnectorConfig, split_list
from replicator.discovery.topic_sync import broker_reason
from replicator.partition_reader import PartitionReadError, as_records, read_to_end
from replicator.state.store import Store
from replicator.topics import provenance
from replicator.topics.selection import compile_java_regex

log = logging.getLogger(__name__)

ADMIN_TIMEOUT_S = 15.0
SCAN_IDLE_TIMEOUT_S = 10.0  # a partition that yields neither records nor its end for this long fails the scan
_IDLE_STATES = {ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD}


class TranslationError(RuntimeError):
    """Offsets could not be translated; the message says why (the broker's words where it answered)."""


@dataclass(frozen=True)
class TranslatedOffset:
    group: str
    topic: str
    partition: int
    source_offset: int
    destination_topic: str
    destination_partition: int
    destination_offset: int
    # Whether every source record before `source_offset` is known to be at the destination (the connector committed
    # past it). Until then the copies of the last records may still arrive after `destination_offset`, and a
    # group placed there would read them again.
    complete: bool = True

    def row(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "source_offset": self.source_offset,
            "destination_topic": self.destination_topic,
            "destination_partition": self.destination_partition,
            "destination_offset": self.destination_offset,
        }


def selected_groups(config: ConnectorConfig, group_ids: Iterable[str]) -> list[str]:
    """Groups matching `groups` and no `groups.exclude` pattern (whole-name Java regexes, as MM2)."""
    include = [compile_java_regex(p) for p in split_list(config.groups)]
    exclude = [compile_java_regex(p) for p in split_list(config.groups_exclude)]
    return sorted(
        g for g in set(group_ids) if any(p.fullmatch(g) for p in include) and not any(p.fullmatch(g) for p in exclude)
    )


def list_groups(admin: AdminClient) -> list[str]:
    try:
        result = admin.list_consumer_groups(request_timeout=ADMIN_TIMEOUT_S).result()
    except KafkaException as exc:
        raise TranslationError(f"cannot list the source cluster's consumer groups: {broker_reason(exc)}") from exc
    return [g.group_id for g in result.valid]


def committed_offsets(admin: AdminClient, group: str, cluster: str) -> dict[SourcePartition, int]:
    """A group's committed offsets on a cluster (partitions without a committed offset left out)."""
    request = ConsumerGroupTopicPartitions(group)
    try:
        result = admin.list_consumer_group_offsets([request], request_timeout=ADMIN_TIMEOUT_S)[group].result()
    except KafkaException as exc:
        raise TranslationError(f"cannot read group {group!r} on the {cluster} cluster: {broker_reason(exc)}") from exc
    return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions if tp.offset >= 0 and not tp.error}


def is_active(admin: AdminClient, group: str) -> str | None:
    """Why a destination group must not be written (it has members, or is rebalancing), or None when idle."""
    try:
        description = admin.describe_consumer_groups([group], request_timeout=ADMIN_TIMEOUT_S)[group].result()
    except KafkaException as exc:
        return f"cannot describe group {group!r} at the destination: {broker_reason(exc)}"
    if description.members or description.state not in _IDLE_STATES:
        return (
            f"destination group {group!r} is active ({description.state.name}, {len(description.members)} "
            "member(s)): not overwritten; stop its consumers first"
        )
    return None


class OffsetTranslator:
    """Translates groups of one connector, given both clusters' Kafka cluster ids."""

    def __init__(self, config: ConnectorConfig, store: Store, source_cluster: str, destination_cluster: str) -> None:
        if config.enable_partition_matching is False:
            raise TranslationError(
                "offset translation needs records kept in their source partition; this connector sets "
                "enable.partition.matching=false"
            )
        self.config = config
        self.store = store
        self.source_cluster = source_cluster
        self.destination_cluster = destination_cluster

    def translate(self, group_offsets: Mapping[str, Mapping[SourcePartition, int]]) -> list[TranslatedOffset]:
        """Translate each group's committed source offsets; partitions this connector does not replicate are
        left out (a group may read other topics too)."""
        starts = self._previous(group_offsets)
        targets: dict[tuple[str, int], list[tuple[str, SourcePartition, int]]] = defaultdict(list)
        for group, offsets in group_offsets.items():
            for (topic, partition), offset in offsets.items():
                if not self.config.selector.matches(topic) or self.config.namer.is_cycle(topic):
                    continue
                targets[(self.config.namer.destination_topic(topic), partition)].append(
                    (group, (topic, partition), offset)
                )
        found = self._scan(targets, starts)
        self._segmented(targets, found)
        self._returning(targets, found)
        replicated = self.store.load_offsets(self.config.name)
        out = []
        for (dest_topic, dest_partition), wanted in sorted(targets.items()):
            for group, (topic, partition), offset in wanted:
                complete = offset == 0 or replicated.get((topic, partition), -1) >= offset
                out.append(
                    TranslatedOffset(
                        group,
                        topic,
                        partition,
                        offset,
                        dest_topic,
                        dest_partition,
                        found[(group, topic, partition)],
                        complete,
                    )
                )
        return out

    def _previous(self, group_offsets: Mapping[str, Mapping[SourcePartition, int]]) -> dict[tuple[str, str, int], int]:
        """Where each search may start: a checkpoint of a source offset not beyond the current one already proves
        that everything before its destination offset is older (see the module docstring)."""
        starts = {}
        for group, offsets in group_offsets.items():
            for cp in self.store.checkpoints(self.config.name, group):
                current = offsets.get((cp.topic, cp.partition))
                if current is not None and cp.source_offset <= current:
                    starts[(group, cp.topic, cp.partition)] = cp.destination_offset
        return starts

    def _scan(
        self,
        targets: Mapping[tuple[str, int], list[tuple[str, SourcePartition, int]]],
        starts: Mapping[tuple[str, str, int], int],
    ) -> dict[tuple[str, str, int], int]:
        """One pass over each destination partition involved, from the earliest start any target allows."""
        found: dict[tuple[str, str, int], int] = {}
        if not targets:
            return found
        consumer = Consumer(
            {
                **self.config.admin_settings("destination"),
                "group.id": f"mirus-{self.config.name}-translate",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",  # copies of an aborted transaction are not there
            }
        )
        try:
            assignment = []
            for (dest_topic, dest_partition), wanted in targets.items():
                low, _high = self._watermarks(consumer, dest_topic, dest_partition)
                for group, (topic, partition), _offset in wanted:
                    found[(group, topic, partition)] = max(low, starts.get((group, topic, partition), low))
                first = min(found[(g, t, p)] for g, (t, p), _o in wanted)
                assignment.append(TopicPartition(dest_topic, dest_partition, first))
            consumer.assign(assignment)
            self._read_to_end(consumer, {(tp.topic, tp.partition) for tp in assignment}, targets, found)
        finally:
            consumer.close()
        return found

    def _segmented(
        self,
        targets: Mapping[tuple[str, int], list[tuple[str, SourcePartition, int]]],
        found: dict[tuple[str, str, int], int],
    ) -> None:
        """Copies made as record batches carry no header: the stored segments say where the newest copy of a record
        below each committed offset is (`Store.translated_offsets`). A partition may hold both kinds of copies; the
        later position wins, as it would between two copies found by their headers."""
        wanted = [(source, dest, offset) for dest, items in targets.items() for _group, source, offset in items]
        points = self.store.translated_offsets(self.config.name, wanted)
        for dest, items in targets.items():
            for group, (topic, partition), offset in items:
                translated = points.get(((topic, partition), dest, offset))
                if translated is not None:
                    found[(group, topic, partition)] = max(found[(group, topic, partition)], translated)

    def _returning(
        self,
        targets: Mapping[tuple[str, int], list[tuple[str, SourcePartition, int]]],
        found: dict[tuple[str, str, int], int],
    ) -> None:
        """Failback: the group's last processed record may itself be a copy of a record that originated at the
        destination (a flow in the opposite direction wrote it); the group then resumes right after that original."""
        wanted: dict[tuple[str, int, int], list[tuple[tuple[str, int], str]]] = defaultdict(list)
        for dest, items in targets.items():
            for group, (topic, partition), offset in items:
                if offset > 0:
                    wanted[(topic, partition, offset - 1)].append((dest, group))
        if not wanted:
            return
        consumer = Consumer(
            {
                **self.config.admin_settings("source"),
                "group.id": f"mirus-{self.config.name}-translate",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "latest",
                "isolation.level": "read_committed",  # the opposite flow's copies, as its readers see them
            }
        )
        prefix = f"{self.destination_cluster}/"
        origins: dict[tuple[str, int, int], tuple[str, int, int]] = {}
        try:
            for topic, partition, offset in sorted(wanted):
                consumer.assign([TopicPartition(topic, partition, offset)])
                msg = next(iter(as_records(consumer.consume(1, 5.0))), None)
                if msg is None or msg.error() is not None or msg.offset() != offset:
                    continue  # gone (compaction, retention) or unreadable: the scan's answer stands
                origin = _source_of(msg.headers(), prefix)
                if origin is not None:
                    origins[(topic, partition, offset)] = origin
        finally:
            consumer.close()
        # A copy made as a record batch carries no header: its flow's segments name its original.
        headless = [((t, p), o) for t, p, o in sorted(wanted) if (t, p, o) not in origins]
        for ((topic, partition), offset), origin in self.store.copy_origins(
            self.destination_cluster, self.source_cluster, headless
        ).items():
            origins[(topic, partition, offset)] = origin
        for copy, origin in origins.items():
            for destination, group in wanted[copy]:
                if origin[:2] == destination:
                    key = (group, copy[0], copy[1])
                    found[key] = max(found[key], origin[2] + 1)

    @staticmethod
    def _watermarks(consumer: Consumer, topic: str, partition: int) -> tuple[int, int]:
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            reason = broker_reason(exc)
            raise TranslationError(f"cannot read destination partition {topic}[{partition}]: {reason}") from exc

    def _read_to_end(
        self,
        consumer: Consumer,
        open_partitions: set[tuple[str, int]],
        targets: Mapping[tuple[str, int], list[tuple[str, SourcePartition, int]]],
        found: dict[tuple[str, str, int], int],
    ) -> None:
        prefix = f"{self.source_cluster}/"
        try:
            for msg in read_to_end(consumer, open_partitions, SCAN_IDLE_TIMEOUT_S):
                origin = _source_of(msg.headers(), prefix)
                if origin is None:
                    continue
                topic, partition, offset = origin
                for group, (want_topic, want_partition), committed in targets[(msg.topic(), msg.partition())]:
                    if (topic, partition) == (want_topic, want_partition) and offset < committed:
                        found[(group, topic, partition)] = max(found[(group, topic, partition)], msg.offset() + 1)
        except PartitionReadError as exc:
            raise TranslationError(f"reading the destination: {exc}") from None

    def save(self, translated: Iterable[TranslatedOffset]) -> None:
        """Keep complete translations as checkpoints (an incomplete one would make a failover re-read)."""
        by_group: dict[str, list[dict[str, object]]] = defaultdict(list)
        for t in translated:
            if t.complete:
                by_group[t.group].append(t.row())
        for group, rows in by_group.items():
            self.store.save_checkpoints(self.config.name, group, rows)


_SOURCE = re.compile(r"(.*)/(\d+)/(\d+)")


def _source_of(headers: provenance.Headers | None, prefix: str) -> tuple[str, int, int] | None:
    """(topic, partition, offset) from `mirus.source` when it names the given source cluster."""
    for name, value in headers or ():
        if name == provenance.SOURCE and value is not None:
            text = value.decode()
            if text.startswith(prefix):
                match = _SOURCE.fullmatch(text[len(prefix) :])
                if match:
                    return match.group(1), int(match.group(2)), int(match.group(3))
    return None


def write_group_offsets(
    destination_admin: AdminClient, group: str, translated: Iterable[TranslatedOffset]
) -> tuple[list[TranslatedOffset], str | None]:
    """Commit translated offsets into the destination group of the same name: only when the group is idle, only
    forward and only complete translations. Returns what was written and, when nothing could be, why."""
    busy = is_active(destination_admin, group)
    if busy is not None:
        return [], busy
    try:
        current = committed_offsets(destination_admin, group, "destination")
    except TranslationError as exc:
        return [], str(exc)
    forward = [
        t
        for t in translated
        if t.group == group and current.get((t.destination_topic, t.destination_partition), -1) < t.destination_offset
    ]
    if not forward:
        return [], None
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(t.destination_topic, t.destination_partition, t.destination_offset) for t in forward]
    )
    try:
        result = destination_admin.alter_consumer_group_offsets([request], request_timeout=ADMIN_TIMEOUT_S)[group]
        partitions = result.result().topic_partitions
    except KafkaException as exc:
        return [], f"destination group {group!r} not written: {broker_reason(exc)}"
    refused = [tp for tp in partitions if tp.error]
    if refused:
        return [], f"destination group {group!r} not written: {refused[0].error.str()} ({refused[0].error.name()})"
    return forward, None


def translate_group(
    config: ConnectorConfig, store: Store, group: str, source_cluster: str, destination_cluster: str
) -> list[TranslatedOffset]:
    """Translate one group now (the source cluster must answer) and keep the result as its checkpoints."""
    source_admin = ClusterAdmin(config.admin_settings("source"))
    offsets = committed_offsets(source_admin, group, "source")
    translator = OffsetTranslator(config, store, source_cluster, destination_cluster)
    translated = translator.translate({group: offsets})
    translator.save(translated)
    return translated


def sync_groups(
    config: ConnectorConfig,
    store: Store,
    source_cluster: str,
    destination_cluster: str,
    admins: tuple[AdminClient, AdminClient] | None = None,
) -> dict[str, str]:
    """The periodic duty: checkpoint every selected group and, with `sync.group.offsets.enabled`, write the
    translations into idle destination groups. Returns problems (group -> why). `admins`: the source's and the
    destination's clients to use (the metadata watcher's live as long as it does); new ones otherwise."""
    source_admin, destination_admin = admins or (
        ClusterAdmin(config.admin_settings("source")),
        ClusterAdmin(config.admin_settings("destination")),
    )
    problems: dict[str, str] = {}
    offsets = {}
    for group in selected_groups(config, list_groups(source_admin)):
        try:
            offsets[group] = committed_offsets(source_admin, group, "source")
        except TranslationError as exc:
            problems[group] = str(exc)
    translator = OffsetTranslator(config, store, source_cluster, destination_cluster)
    translated = translator.translate(offsets)
    translator.save(translated)
    if config.sync_group_offsets_enabled:
        for group in offsets:
            _written, problem = write_group_offsets(destination_admin, group, translated)
            if problem:
                problems[group] = problem
    return problems
