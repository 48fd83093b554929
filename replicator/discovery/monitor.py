"""The monitor: cluster metadata in, an assignment generation out (Mirus's KafkaMonitor, without restarts).

`plan_partitions` is the pure decision (selection, cycle rule, naming, destination checking); `KafkaMonitor`
reads both clusters' metadata, records snapshots, creates and grows destination topics (asked in one poll, collected in
a later one when it is given the watcher's `TopicRequests`) and syncs their configs (`replicator.discovery.topic_sync`),
and writes a new assignment generation only when partition membership changed.
Partitions held back (destination missing, not creatable or not growable) are recorded PAUSED with the reason.
Running tasks pick the new generation up live; nothing is restarted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from replicator.assignment import SourcePartition, assign_partitions, membership
from replicator.clusters import ClusterAdmin, ClusterView, MetadataUnavailableError, read_cluster, topic_partitions
from replicator.configuration.connector import ConnectorConfig, load
from replicator.discovery import heartbeats
from replicator.discovery.acl_sync import ACL_PROBLEM, AclSync, sync_topic_acls
from replicator.discovery.heartbeats import HEARTBEATS_TOPIC, HeartbeatProducers
from replicator.discovery.offset_translation import TranslationError, sync_groups
from replicator.discovery.topic_sync import (
    TopicRequests,
    broker_reason,
    destination_topics,
    ensure_destination_topics,
    sync_topic_configs,
)
from replicator.state.records import ConnectorRecord, FlowRow
from replicator.state.store import Store

__all__ = [
    "KafkaMonitor",
    "MetadataUnavailableError",
    "MonitorResult",
    "PartitionPlan",
    "PollMemory",
    "plan_partitions",
]


@dataclass(frozen=True)
class PartitionPlan:
    replicate: list[SourcePartition]
    missing_destination: list[SourcePartition] = field(default_factory=list)  # selected, destination absent
    cycles: list[str] = field(default_factory=list)  # selected topics that originated at the destination


@dataclass(frozen=True)
class MonitorResult:
    connector: str
    generation: int  # current generation after this poll
    changed: bool
    tasks: dict[int, list[SourcePartition]]
    plan: PartitionPlan
    poll_wait_s: float  # when to look again (monitor.poll.wait.ms)


def replicated_topics(config: ConnectorConfig, source_topics: Mapping[str, int]) -> list[str]:
    """The selected source topics, plus the source's heartbeats topic while heartbeats are emitted (as MM2)."""
    topics = config.selector.select(source_topics)
    if config.emit_heartbeats_enabled and HEARTBEATS_TOPIC in source_topics and HEARTBEATS_TOPIC not in topics:
        topics = sorted([*topics, HEARTBEATS_TOPIC])
    return topics


def plan_partitions(
    config: ConnectorConfig, source_topics: Mapping[str, int], destination_topics: Mapping[str, int]
) -> PartitionPlan:
    """Which source partitions to replicate, given topic → partition count on each cluster."""
    replicate: list[SourcePartition] = []
    missing: list[SourcePartition] = []
    cycles: list[str] = []
    for topic in replicated_topics(config, source_topics):
        if config.namer.is_cycle(topic):
            cycles.append(topic)
            continue
        destination = config.namer.destination_topic(topic)
        dest_partitions = destination_topics.get(destination)
        for partition in range(source_topics[topic]):
            if config.enable_destination_topic_checking and (
                dest_partitions is None or (config.requires_destination_partition and partition >= dest_partitions)
            ):
                missing.append((topic, partition))
            else:
                replicate.append((topic, partition))
    return PartitionPlan(replicate, missing, cycles)


@dataclass(frozen=True)
class Admins:
    source: AdminClient
    destination: AdminClient


def ids(source: ClusterView, destination: ClusterView, config: ConnectorConfig) -> tuple[str, str]:
    """Both clusters' ids; the aliases stand in for brokers that report none."""
    return source.cluster_id or config.source_cluster_alias, destination.cluster_id or config.target_cluster_alias


def held_reasons(
    config: ConnectorConfig, missing: list[SourcePartition], blocked: Mapping[str, str]
) -> dict[SourcePartition, str]:
    """Why each held-back partition is not replicated: the broker's reason when creating or growing failed."""
    out = {}
    for topic, partition in missing:
        destination = config.namer.destination_topic(topic)
        out[(topic, partition)] = blocked.get(destination) or (
            f"destination partition {destination}[{partition}] does not exist"
            + ("" if config.topic_creation_enable else " (topic.creation.enable=false)")
        )
    return out


@dataclass
class Written:
    """What the monitor last wrote (or read) for one connector: a poll that finds the same writes nothing."""

    identity: datetime  # the connector's updated_at: a new version, a state change or a recreated connector
    snapshots: dict[str, tuple[dict[str, int], str | None]] = field(default_factory=dict)  # role -> last recorded
    flow: FlowRow | None = None
    assignment: tuple[int, dict[int, list[SourcePartition]]] | None = None  # generation and its tasks
    held: dict[SourcePartition, str] | None = None
    # Topic ACL sync's last outcome and when it ran (monotonic): kept here, not in the flow row, since creating an
    # ACL that exists changes nothing, so a sync repeated after a restart costs one request and no harm.
    acls: AclSync = field(default_factory=lambda: AclSync(frozenset()))
    acls_synced_at: float | None = None
    acls_topics: frozenset[str] = frozenset()  # the destination topics of that sync: a new one is synced at once


class PollMemory:
    """Per connector, what its polls last wrote, kept by whatever outlives the polls (the metadata watcher).

    Snapshots, the flow and held partitions are written by the monitor alone, so what it wrote is what the database
    holds; an assignment is trusted only for the generation the connector row names. An unchanged periodic poll
    then reads and writes nothing but its duties' own results."""

    def __init__(self) -> None:
        self.connectors: dict[str, Written] = {}

    def of(self, record: ConnectorRecord) -> Written:
        written = self.connectors.get(record.name)
        if written is None or written.identity != record.updated_at:
            written = self.connectors[record.name] = Written(record.updated_at)
        return written

    def forget(self, connector: str) -> None:
        """Someone else wrote the connector's rows: its next poll reads them again."""
        self.connectors.pop(connector, None)

    def keep(self, connectors: Collection[str]) -> None:
        self.connectors = {name: w for name, w in self.connectors.items() if name in connectors}


HIDDEN_PROBLEM = "source topic"  # a selected topic the source does not show the principal


def hidden_topics(source_admin: AdminClient, absent: Collection[str]) -> dict[str, str]:
    """Topics named in the selection that the source's metadata left out because the principal may not see them
    (a broker answers TOPIC_AUTHORIZATION_FAILED whether or not such a topic exists): topic -> why. A topic that
    simply does not exist yet is no problem. One Metadata request, only while some named topic is absent."""
    if not absent:
        return {}
    try:
        found = topic_partitions(source_admin, absent)
    except KafkaException:
        return {}  # the cluster itself is unreadable: its snapshot error says so
    who = f"source cluster ({source_admin.identity})" if isinstance(source_admin, ClusterAdmin) else "source cluster"
    return {
        topic: f"{who} does not show topic {topic!r} ({partitions.error}): the principal needs Describe and Read on "
        f"Topic {topic!r} there (docs/SECURITY.md)"
        for topic, partitions in found.items()
        if partitions.error is not None and "authoriz" in partitions.error.lower()
    }


def _replace_problems(updates: dict[str, Any], flow: FlowRow, kind: str, found: Mapping[str, str]) -> None:
    """The flow's problems of `kind` (keys `kind` or `kind <name>`) replaced by `found` (name -> why)."""
    current = dict(cast(Mapping[str, str], updates.get("problems", flow.problems)))
    shown = {k: v for k, v in current.items() if k != kind and not k.startswith(f"{kind} ")}
    shown.update({f"{kind} {name}".strip(): why for name, why in found.items()})
    if shown != current:
        updates.update(problems=shown)


class KafkaMonitor:
    def __init__(
        self,
        store: Store,
        read_view: Callable[[AdminClient, str], ClusterView] = read_cluster,
        admin_for: Callable[[dict[str, str]], AdminClient] = ClusterAdmin,
        topic_requests: TopicRequests | None = None,
        heartbeat_producers: HeartbeatProducers | None = None,
        memory: PollMemory | None = None,
        unowned_paused: Callable[[str], Collection[SourcePartition]] | None = None,
        flow_writes: dict[str, dict[str, object]] | None = None,
    ) -> None:
        """`read_view`: how a cluster is read (the metadata watcher passes the reading it shares among connectors);
        `admin_for`: the admin client for a cluster's settings (the watcher's live as long as it does);
        `topic_requests`: destination topic creations and growths in flight (the watcher's outlive a poll, so a
        poll never waits for them); without, each poll waits for those it asks for. `heartbeat_producers`: the
        same for heartbeats (the watcher's collect a heartbeat's acknowledgement on a later poll); without, each
        poll waits for its heartbeat's. `memory`: what earlier polls wrote (the watcher's outlives a monitor).
        `unowned_paused`: a connector's PAUSED partitions no task owns (the watcher reads them once a round for
        every connector); without, every poll writes its held partitions and removes stale ones. `flow_writes`: where
        a poll leaves its flow's changes for the caller to write with others (the watcher, once a round); without,
        each poll writes its own."""
        self.store = store
        self.read_view = read_view
        self.admin_for = admin_for
        self.topic_requests = topic_requests or TopicRequests(wait=True)
        self.heartbeat_producers = heartbeat_producers or HeartbeatProducers(wait=True)
        self.memory = memory or PollMemory()
        self.unowned_paused = unowned_paused
        self.flow_writes = flow_writes

    def _read(self, connector: str, admin: AdminClient, role: str, written: Written) -> ClusterView:
        try:
            view = self.read_view(admin, role)
        except MetadataUnavailableError as exc:
            self._record_snapshot(connector, role, {}, str(exc), written)
            raise
        self._record_snapshot(connector, role, view.partition_counts(), None, written)
        return view

    def _record_snapshot(
        self, connector: str, role: str, topics: dict[str, int], error: str | None, written: Written
    ) -> None:
        if written.snapshots.get(role) != (topics, error):
            self.store.record_snapshot(connector, role, topics, error)
            written.snapshots[role] = (topics, error)

    def poll(
        self, connector: str, record: ConnectorRecord | None = None, config: ConnectorConfig | None = None
    ) -> MonitorResult:
        """Read both clusters, apply the connector's rules, and store a new generation if membership changed.

        `record` and `config`: the connector as the caller just read and loaded it (the watcher lists them all)."""
        record = record or self.store.get_connector(connector)
        config = config or load(record.properties)
        written = self.memory.of(record)
        admins = Admins(
            self.admin_for(config.admin_settings("source")), self.admin_for(config.admin_settings("destination"))
        )
        source = self._read(connector, admins.source, "source", written)
        destination = self._read(connector, admins.destination, "destination", written)
        flow = written.flow or self.store.flow(connector)
        updates: dict[str, Any] = {}
        seen = (source.cluster_id, destination.cluster_id)
        if (flow.source_cluster_id, flow.destination_cluster_id) != seen:
            updates.update(source_cluster_id=source.cluster_id, destination_cluster_id=destination.cluster_id)

        selected = [t for t in replicated_topics(config, source.partition_counts()) if not config.namer.is_cycle(t)]
        pairs = destination_topics(config, source, selected)
        destination_counts, blocked = destination.partition_counts(), {}
        if config.topic_creation_enable:
            outcome = ensure_destination_topics(
                config, admins.source, admins.destination, source, destination, pairs, self.topic_requests, connector
            )
            destination_counts, blocked = outcome.destination, outcome.blocked
        plan = plan_partitions(config, source.partition_counts(), destination_counts)
        self._hold(connector, held_reasons(config, plan.missing_destination, blocked), plan.replicate, written)
        known = written.assignment
        if known is None or known[0] != record.assignment_generation:
            known = self.store.current_assignment(connector)
        tasks = assign_partitions(plan.replicate, config.tasks_max, known[1])
        # Generation 0 has no rows: the first poll writes generation 1 even when it assigns nothing.
        unchanged = known[0] > 0 and membership(tasks) == membership(known[1])
        generation = None if unchanged else self.store.write_assignment(connector, tasks)
        written.assignment = known if generation is None else (generation, tasks)

        # After the new generation is written: the tasks pick it up while heartbeats, checkpoints and syncs run.
        existing = {d: s for d, s in pairs.items() if d in destination_counts}
        self._periodic_duties(config, admins, source, destination, existing, flow, updates)
        if config.sync_topic_acls_enabled:
            self._sync_acls(config, admins, existing, flow, updates, written)
        hidden = hidden_topics(admins.source, config.selector.whitelist - source.topics.keys())
        _replace_problems(updates, flow, HIDDEN_PROBLEM, hidden)
        if updates and self.flow_writes is not None:
            self.flow_writes.setdefault(connector, {}).update(updates)
        elif updates:
            self.store.update_flow(connector, **updates)
        written.flow = replace(flow, **updates)
        current = written.assignment[0]
        return MonitorResult(
            connector, current, generation is not None, tasks, plan, config.monitor_poll_wait_ms / 1000
        )

    def _hold(
        self, connector: str, held: dict[SourcePartition, str], assigned: list[SourcePartition], written: Written
    ) -> None:
        """Record the held-back partitions, unless they are those recorded last and no stale row is left (a task
        releases a partition it had paused when the partition leaves its assignment; an assigned partition no task
        has claimed yet keeps its row)."""
        if self.unowned_paused is not None and held == written.held:
            unowned = set(self.unowned_paused(connector)) - held.keys()
            if not unowned or unowned <= set(assigned):
                return
        self.store.hold_partitions(connector, held, assigned)
        written.held = held

    @staticmethod
    def _sync_acls(
        config: ConnectorConfig,
        admins: Admins,
        pairs: Mapping[str, str],
        flow: FlowRow,
        updates: dict[str, Any],
        written: Written,
    ) -> None:
        """Topic ACL sync when its interval is due or a destination topic appeared; its failure is the flow's
        `acl sync` problem until a sync succeeds."""
        now, topics = time.monotonic(), frozenset(pairs)
        last = written.acls_synced_at
        if last is not None and now - last < config.sync_topic_acls_interval_seconds and topics <= written.acls_topics:
            return
        written.acls = sync_topic_acls(admins.source, admins.destination, pairs, written.acls.bindings)
        written.acls_synced_at, written.acls_topics = now, topics
        _replace_problems(updates, flow, ACL_PROBLEM, {"": written.acls.problem} if written.acls.problem else {})
        if written.acls.problem is None:
            updates.update(acls_synced_at=datetime.now(UTC), acls_mirrored=len(written.acls.bindings))

    def _periodic_duties(
        self,
        config: ConnectorConfig,
        admins: Admins,
        source: ClusterView,
        destination: ClusterView,
        pairs: Mapping[str, str],
        flow: FlowRow,
        updates: dict[str, Any],
    ) -> None:
        """Topic config sync, group checkpoints (and offset sync) and heartbeats, each when its interval is due.

        Each duty's failures replace its own entries in the flow's problems (shown on the connector)."""
        now = datetime.now(UTC)

        def due(column: str, interval_s: int) -> bool:
            last = getattr(flow, column)
            return last is None or now - last >= timedelta(seconds=interval_s)

        def problems(kind: str, found: Mapping[str, str]) -> dict[str, str]:
            current = dict(cast(Mapping[str, str], updates.get("problems") or flow.problems))
            kept = {k: v for k, v in current.items() if not k.startswith(f"{kind} ")}
            return {**kept, **{f"{kind} {name}": reason for name, reason in found.items()}}

        if config.sync_topic_configs_enabled and due("configs_synced_at", config.sync_topic_configs_interval_seconds):
            try:
                _changed, failed = sync_topic_configs(config, admins.source, admins.destination, pairs)
            except KafkaException as exc:  # a duty never stops discovery and assignment
                failed = {"*": broker_reason(exc)}
            updates.update(configs_synced_at=now, problems=problems("topic", failed))
        if (config.emit_checkpoints_enabled or config.sync_group_offsets_enabled) and due(
            "groups_synced_at", config.checkpoint_interval_s
        ):
            source_id, destination_id = ids(source, destination, config)
            try:
                failed = sync_groups(config, self.store, source_id, destination_id, (admins.source, admins.destination))
            except (TranslationError, KafkaException) as exc:
                failed = {"*": broker_reason(exc) if isinstance(exc, KafkaException) else str(exc)}
            updates.update(groups_synced_at=now, problems=problems("group", failed))
        emit_failed: str | None = None
        if config.emit_heartbeats_enabled and due("heartbeat_emitted_at", config.emit_heartbeats_interval_seconds):
            try:
                if self.heartbeat_producers.emit(config, admins.source, source, destination.cluster_id):
                    updates.update(heartbeat_emitted_at=now)
            except (heartbeats.HeartbeatError, KafkaException) as exc:
                emit_failed = broker_reason(exc) if isinstance(exc, KafkaException) else str(exc)
        # Only an acknowledged heartbeat is remembered, with the offset its acknowledgement gave: liveness counts
        # from it once the connector has committed past that offset.
        delivered = self.heartbeat_producers.collect(config.name)
        emitted = flow.heartbeats
        for heartbeat in delivered:
            if heartbeat.error is None and heartbeat.offset is not None:  # (a written heartbeat has its offset)
                emitted = heartbeats.remember(emitted, heartbeat.offset, heartbeat.timestamp_ms)
        if emitted != flow.heartbeats:
            updates.update(heartbeats=emitted)
        if emit_failed is None and delivered:
            emit_failed = delivered[-1].error
        shown = problems("heartbeat", {"emit": emit_failed} if emit_failed else {})
        if (emit_failed is not None or delivered) and shown != (updates.get("problems") or flow.problems):
            updates.update(problems=shown)
