"""Destination topics that follow their source (MirrorMaker 2's topic management).

- A selected source topic without a destination topic gets one with the source's partition count and topic
  configs (minus `config.properties.exclude`), and `replication.factor` replicas (default: the source topic's,
  capped by the destination's broker count). Switch: `topic.creation.enable`.
- A source topic that gained partitions has them added at the destination (CreatePartitions) before the monitor
  assigns the new partitions, so every record stays in its own partition. When the destination cannot be grown
  (no permission, or a broker without CreatePartitions), the new partitions are held back with the broker's
  reason and the rest of the connector continues.
- Topic configs are copied again every `sync.topic.configs.interval.seconds` (`sync.topic.configs.enabled`).

Which configs are copied follows MM2's DefaultConfigPropertyFilter: those the source reports as set on the topic
(not defaults, not broker-level values), never read-only or sensitive ones, never excluded names. Copies use
IncrementalAlterConfigs (Kafka >= 2.3), or AlterConfigs for older brokers, which replaces a topic's whole set of
overrides, so the destination's own excluded overrides are sent along to keep them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

from replicator.clusters import ClusterView
from replicator.config import ConnectorConfig, split_list
from replicator.selection import compile_java_regex

log = logging.getLogger(__name__)

ADMIN_TIMEOUT_S = 15.0
_BROKER_LEVEL = {
    ConfigSource.STATIC_BROKER_CONFIG.value,
    ConfigSource.DYNAMIC_BROKER_CONFIG.value,
    ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value,
    ConfigSource.DEFAULT_CONFIG.value,
}


def broker_reason(exc: BaseException) -> str:
    """The broker's (or client's) words for a failed admin call: message and error name."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    if isinstance(err, KafkaError):
        return f"{err.str()} ({err.name()})"
    return str(exc)


def _error_code(exc: BaseException) -> int | None:
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return err.code() if isinstance(err, KafkaError) else None


class ConfigFilter:
    """Which topic configs are copied from source to destination."""

    def __init__(self, exclude: Iterable[str]) -> None:
        self.exclude = [compile_java_regex(pattern) for pattern in exclude]

    def excluded(self, name: str) -> bool:
        return any(pattern.fullmatch(name) for pattern in self.exclude)

    def copies(self, entry: Any) -> bool:
        """A value set on the source topic that the destination topic should have too."""
        source = getattr(entry.source, "value", entry.source)
        return not (
            entry.is_default or entry.is_read_only or entry.is_sensitive or source in _BROKER_LEVEL
        ) and not self.excluded(entry.name)


def topic_overrides(admin: AdminClient, topics: Iterable[str]) -> dict[str, dict[str, Any] | str]:
    """Per topic, its config entries (name -> ConfigEntry), or the broker's reason they could not be read."""
    resources = [ConfigResource(ResourceType.TOPIC, topic) for topic in sorted(set(topics))]
    if not resources:
        return {}
    out: dict[str, dict[str, Any] | str] = {}
    for resource, future in admin.describe_configs(resources, request_timeout=ADMIN_TIMEOUT_S).items():
        try:
            out[resource.name] = dict(future.result())
        except Exception as exc:  # KafkaException per resource; anything else is reported the same way
            out[resource.name] = f"cannot read topic configs: {broker_reason(exc)}"
    return out


@dataclass
class TopicSyncOutcome:
    created: list[str] = field(default_factory=list)
    grown: dict[str, int] = field(default_factory=dict)  # destination topic -> new partition count
    blocked: dict[str, str] = field(default_factory=dict)  # destination topic -> why it cannot take all partitions
    destination: dict[str, int] = field(default_factory=dict)  # destination partition counts after the changes


def destination_topics(config: ConnectorConfig, source: ClusterView, selected: Iterable[str]) -> dict[str, str]:
    """Destination topic -> the source topic it follows (the first by name if several map to one)."""
    pairs: dict[str, str] = {}
    for topic in sorted(selected):
        pairs.setdefault(config.namer.destination_topic(topic), topic)
    return pairs


def ensure_destination_topics(
    config: ConnectorConfig,
    source_admin: AdminClient,
    destination_admin: AdminClient,
    source: ClusterView,
    destination: ClusterView,
    pairs: Mapping[str, str],
) -> TopicSyncOutcome:
    """Create missing destination topics and grow smaller ones; never shrink or touch anything else."""
    return _TopicCreation(config, source_admin, destination_admin, source, destination).ensure(pairs)


@dataclass
class _TopicCreation:
    config: ConnectorConfig
    source_admin: AdminClient
    destination_admin: AdminClient
    source: ClusterView
    destination: ClusterView

    def ensure(self, pairs: Mapping[str, str]) -> TopicSyncOutcome:
        outcome = TopicSyncOutcome(destination=self.destination.partition_counts())
        have, want = self.destination.topics, self.source.topics
        missing = {dest: src for dest, src in pairs.items() if dest not in have}
        smaller = {
            dest: want[src].partitions
            for dest, src in pairs.items()
            if dest in have and have[dest].partitions < want[src].partitions
        }
        if missing:
            self._create(missing, outcome)
        if smaller:
            self._grow(smaller, outcome)
        return outcome

    def _create(self, missing: Mapping[str, str], outcome: TopicSyncOutcome) -> None:
        configs = topic_overrides(self.source_admin, missing.values())
        keep = ConfigFilter(split_list(self.config.config_properties_exclude))
        new_topics = []
        for dest, src in missing.items():
            layout = self.source.topics[src]
            entries = configs.get(src)
            if isinstance(entries, str):
                outcome.blocked[dest] = f"destination topic {dest!r} not created: source topic {entries}"
                continue
            replicas = self.config.replication_factor
            if replicas < 1:
                replicas = max(1, min(layout.replication_factor, self.destination.brokers or 1))
            copied = {name: e.value for name, e in (entries or {}).items() if keep.copies(e)}
            new_topics.append(NewTopic(dest, layout.partitions, replicas, config=copied))
        if not new_topics:
            return
        futures = self.destination_admin.create_topics(new_topics, request_timeout=ADMIN_TIMEOUT_S)
        for new_topic in new_topics:
            dest = new_topic.topic
            try:
                futures[dest].result()
            except Exception as exc:
                if _error_code(exc) != KafkaError.TOPIC_ALREADY_EXISTS:  # created meanwhile: the next poll sees it
                    outcome.blocked[dest] = f"destination topic {dest!r} could not be created: {broker_reason(exc)}"
                continue
            outcome.created.append(dest)
            outcome.destination[dest] = new_topic.num_partitions
            log.info("created destination topic %s (%d partitions)", dest, new_topic.num_partitions)

    def _grow(self, wanted: Mapping[str, int], outcome: TopicSyncOutcome) -> None:
        futures = self.destination_admin.create_partitions(
            [NewPartitions(dest, count) for dest, count in sorted(wanted.items())], request_timeout=ADMIN_TIMEOUT_S
        )
        for dest, count in sorted(wanted.items()):
            try:
                futures[dest].result()
            except Exception as exc:
                have = self.destination.topics[dest].partitions
                outcome.blocked[dest] = (
                    f"destination topic {dest!r} has {have} partitions, the source {count}; adding partitions "
                    f"failed: {broker_reason(exc)}"
                )
                continue
            outcome.grown[dest] = count
            outcome.destination[dest] = count
            log.info("grew destination topic %s to %d partitions", dest, count)


def sync_topic_configs(
    config: ConnectorConfig, source_admin: AdminClient, destination_admin: AdminClient, pairs: Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """Make each existing destination topic's copied configs equal the source's: (changed topics, problems)."""
    keep = ConfigFilter(split_list(config.config_properties_exclude))
    sources = topic_overrides(source_admin, pairs.values())
    destinations = topic_overrides(destination_admin, pairs)
    changed: list[str] = []
    problems: dict[str, str] = {}
    for dest, src in sorted(pairs.items()):
        wanted_entries, current_entries = sources.get(src), destinations.get(dest)
        if isinstance(wanted_entries, str) or isinstance(current_entries, str):
            problems[dest] = (
                f"config sync of {dest!r}: {wanted_entries if isinstance(wanted_entries, str) else current_entries}"
            )
            continue
        if wanted_entries is None or current_entries is None:
            continue
        wanted = {name: e.value for name, e in wanted_entries.items() if keep.copies(e)}
        current = {name: e.value for name, e in current_entries.items() if keep.copies(e)}
        if wanted == current:
            continue
        try:
            _alter(destination_admin, dest, wanted, current, current_entries, keep)
        except Exception as exc:
            problems[dest] = f"config sync of {dest!r} failed: {broker_reason(exc)}"
            continue
        changed.append(dest)
        log.info("synced configs of destination topic %s", dest)
    return changed, problems


def _alter(
    admin: AdminClient,
    topic: str,
    wanted: Mapping[str, str],
    current: Mapping[str, str],
    current_entries: Mapping[str, Any],
    keep: ConfigFilter,
) -> None:
    ops = [
        ConfigEntry(n, v, incremental_operation=AlterConfigOpType.SET) for n, v in wanted.items() if current.get(n) != v
    ]
    ops += [ConfigEntry(n, None, incremental_operation=AlterConfigOpType.DELETE) for n in current if n not in wanted]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=ops)
    try:
        admin.incremental_alter_configs([resource], request_timeout=ADMIN_TIMEOUT_S)[resource].result()
        return
    except KafkaException as exc:
        if _error_code(exc) not in (KafkaError._UNSUPPORTED_FEATURE, KafkaError.UNSUPPORTED_VERSION):
            raise
    # AlterConfigs replaces every override of the topic: send the destination's own (excluded) overrides too.
    own = {
        name: e.value
        for name, e in current_entries.items()
        if keep.excluded(name) and not (e.is_default or e.is_read_only or e.is_sensitive)
    }
    legacy = ConfigResource(ResourceType.TOPIC, topic, set_config={**own, **wanted})
    admin.alter_configs([legacy], request_timeout=ADMIN_TIMEOUT_S)[legacy].result()
