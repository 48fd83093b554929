"""The monitor: cluster metadata in, an assignment generation out (Mirus's KafkaMonitor, without restarts).

`plan_partitions` is the pure decision (selection, cycle rule, naming, destination checking); `KafkaMonitor`
reads both clusters' metadata, records snapshots and writes a new assignment generation only when partition
membership changed. Running tasks pick the new generation up live; nothing is restarted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from confluent_kafka.admin import AdminClient

from replicator.assignment import SourcePartition, assign_partitions
from replicator.config import ConnectorConfig, load
from replicator.store import Store

METADATA_TIMEOUT_S = 5.0


class MetadataUnavailableError(RuntimeError):
    """A cluster's metadata could not be read; the message names the cluster (never its credentials)."""


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


def plan_partitions(
    config: ConnectorConfig, source_topics: Mapping[str, int], destination_topics: Mapping[str, int]
) -> PartitionPlan:
    """Which source partitions to replicate, given topic → partition count on each cluster."""
    replicate: list[SourcePartition] = []
    missing: list[SourcePartition] = []
    cycles: list[str] = []
    for topic in config.selector.select(source_topics):
        if config.namer.is_cycle(topic):
            cycles.append(topic)
            continue
        destination = config.namer.destination_topic(topic)
        dest_partitions = destination_topics.get(destination)
        for partition in range(source_topics[topic]):
            if config.destination_topic_checking and (
                dest_partitions is None or (config.partition_matching and partition >= dest_partitions)
            ):
                missing.append((topic, partition))
            else:
                replicate.append((topic, partition))
    return PartitionPlan(replicate, missing, cycles)


def topic_partitions(settings: Mapping[str, str], cluster: str) -> dict[str, int]:
    """Topic name → partition count, read with the given client settings."""
    try:
        metadata = AdminClient(dict(settings)).list_topics(timeout=METADATA_TIMEOUT_S)
    except Exception as exc:  # KafkaException on timeout or transport failure
        raise MetadataUnavailableError(f"{cluster} cluster metadata unavailable: {exc}") from exc
    return {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}


class KafkaMonitor:
    def __init__(self, store: Store) -> None:
        self.store = store

    def poll(self, connector: str) -> MonitorResult:
        """Read both clusters, apply the connector's rules, and store a new generation if membership changed."""
        record = self.store.get_connector(connector)
        config = load(record.properties)
        try:
            source = topic_partitions(config.admin_settings("source"), "source")
        except MetadataUnavailableError as exc:
            self.store.record_snapshot(connector, "source", {}, str(exc))
            raise
        self.store.record_snapshot(connector, "source", source, None)
        destination: dict[str, int] = {}
        if config.destination_topic_checking or config.partition_matching is not False:
            try:
                destination = topic_partitions(config.admin_settings("destination"), "destination")
            except MetadataUnavailableError as exc:
                self.store.record_snapshot(connector, "destination", {}, str(exc))
                raise
            self.store.record_snapshot(connector, "destination", destination, None)
        plan = plan_partitions(config, source, destination)
        previous = self.store.read_assignment(connector)
        tasks = assign_partitions(plan.replicate, config.tasks_max, previous)
        generation = self.store.write_assignment(connector, tasks)
        current = generation if generation is not None else record.assignment_generation
        return MonitorResult(
            connector, current, generation is not None, tasks, plan, config.monitor_poll_wait_ms / 1000
        )
