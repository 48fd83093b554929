"""Destination topics that follow their source (MirrorMaker 2's topic management).

- A selected source topic without a destination topic gets one with the source's partition count and topic
  configs (minus `config.properties.exclude`), and `replication.factor` replicas (default: the source topic's,
  capped by the destination's broker count). Switch: `topic.creation.enable`.
- A source topic that gained partitions has them added at the destination (CreatePartitions) before the monitor
  assigns the new partitions, so every record stays in its own partition. When the destination cannot be grown
  (no permission, or a broker without CreatePartitions), the new partitions are held back with the broker's
  reason and the rest of the connector continues.
- Creating and growing are asked in one poll and collected in a later one (`TopicRequests`, kept by the metadata
  watcher across its rounds; at most one request in flight per destination topic): the controller's time, tens of
  seconds for thousands of partitions on Kafka 1.0, never holds up a round and other connectors' discovery. Until
  the outcome arrives, the topic's partitions are held back with "creating destination topic ..." or "adding
  partitions to ..." and the time it was asked (after a failure, with that failure while the retry is in flight).
- Topic configs are copied again every `sync.topic.configs.interval.seconds` (`sync.topic.configs.enabled`).

Which configs are copied follows MM2's DefaultConfigPropertyFilter: those the source reports as set on the topic
(not defaults, not broker-level values), never read-only or sensitive ones, never excluded names. Copies use
IncrementalAlterConfigs (Kafka >= 2.3), or AlterConfigs for older brokers, which replaces a topic's whole set of
overrides, so the destination's own excluded overrides are sent along to keep them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterable, Mapping
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, Literal

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
from replicator.configuration.connector import ConnectorConfig, split_list
from replicator.topics.selection import compile_java_regex

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


AUTHORIZATION_FAILURES = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)


def missing_acl(exc: BaseException, operation: str, resource: str) -> str:
    """For a refusal by the authorizer, the ACL to grant (`operation` on `resource`, as docs/SECURITY.md lists)."""
    if _error_code(exc) in AUTHORIZATION_FAILURES:
        return f"; the principal needs {operation} on {resource} (docs/SECURITY.md)"
    return ""


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
            needed = missing_acl(exc, "DescribeConfigs", f"Topic {resource.name!r}")
            out[resource.name] = f"cannot read topic configs: {broker_reason(exc)}{needed}"
    return out


@dataclass
class TopicSyncOutcome:
    created: list[str] = field(default_factory=list)
    grown: dict[str, int] = field(default_factory=dict)  # destination topic -> new partition count
    blocked: dict[str, str] = field(default_factory=dict)  # destination topic -> why it cannot take all partitions
    destination: dict[str, int] = field(default_factory=dict)  # destination partition counts after the changes


@dataclass
class _Request:
    """A creation or growth of one destination topic, asked of its cluster's controller."""

    kind: Literal["create", "grow"]
    partitions: int  # the count asked for
    requested_at: datetime
    future: Future[None] | None  # None: settled with `failure`, asked again at the connector's next poll
    connectors: set[str]  # whose polls wait for its outcome
    failure: str | None = None  # the last attempt's failure, shown while the next is in flight


class TopicRequests:
    """Destination topic creations and growths in flight, one per destination cluster and topic at most.

    A poll asks and a later poll collects the outcome, so the controller's time (tens of seconds for thousands of
    partitions on Kafka 1.0) is never spent inside a poll: kept by whatever outlives the polls (the metadata watcher,
    for as long as it runs). `wait`: each poll waits for what it asked, for a monitor used on its own (one poll
    then shows the outcome)."""

    def __init__(self, *, wait: bool = False) -> None:
        self.wait = wait
        self.requests: dict[tuple[str, str], _Request] = {}  # (destination cluster, topic) -> its request
        self.settled = threading.Event()  # set when a request's outcome arrives; cleared by whoever collects

    def ready(self, connector: str | None = None) -> bool:
        """An outcome `connector` (any connector, if None) waits for has arrived: its next poll should collect it."""
        return any(
            r.future is not None and r.future.done() and (connector is None or connector in r.connectors)
            for r in self.requests.values()
        )

    def keep(self, connectors: Collection[str]) -> None:
        """Forget settled requests of topics none of `connectors` replicates any more."""
        self.requests = {key: r for key, r in self.requests.items() if r.connectors & set(connectors) or _in_flight(r)}


def _in_flight(request: _Request) -> bool:
    return request.future is not None and not request.future.done()


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
    requests: TopicRequests,
    connector: str,
) -> TopicSyncOutcome:
    """Ask for missing destination topics and for the partitions smaller ones lack (never shrink or touch anything
    else), and report what `requests` settled: created or grown topics, failures, and those still in flight."""
    return _TopicCreation(config, source_admin, destination_admin, source, destination, requests, connector).ensure(
        pairs
    )


@dataclass
class _TopicCreation:
    config: ConnectorConfig
    source_admin: AdminClient
    destination_admin: AdminClient
    source: ClusterView
    destination: ClusterView
    requests: TopicRequests
    connector: str

    def ensure(self, pairs: Mapping[str, str]) -> TopicSyncOutcome:
        outcome = TopicSyncOutcome(destination=self.destination.partition_counts())
        have, want = self.destination.topics, self.source.topics
        missing = {dest: src for dest, src in pairs.items() if dest not in have}
        smaller = {
            dest: want[src].partitions
            for dest, src in pairs.items()
            if dest in have and have[dest].partitions < want[src].partitions
        }
        self._forget({*missing, *smaller})
        if asked := {dest: src for dest, src in missing.items() if not self._asked(dest)}:
            self._create(asked, outcome)
        if asked_more := {dest: count for dest, count in smaller.items() if not self._asked(dest)}:
            self._grow(asked_more)
        if self.requests.wait:
            asked_now = [self.requests.requests.get(self._key(dest)) for dest in [*missing, *smaller]]
            # Bounded although librdkafka ends each request at its request timeout: a poll must never hang.
            futures_wait([r.future for r in asked_now if r and r.future], timeout=2 * ADMIN_TIMEOUT_S)
        for dest in sorted({*missing, *smaller}):
            self._settle(dest, outcome)
        return outcome

    @cached_property
    def cluster(self) -> str:
        return self.destination.cluster_id or self.config.admin_settings("destination")["bootstrap.servers"]

    def _key(self, dest: str) -> tuple[str, str]:
        return self.cluster, dest

    def _partitions(self, dest: str) -> int:
        return self.destination.topics[dest].partitions if dest in self.destination.topics else 0

    def _asked(self, dest: str) -> bool:
        """A request for `dest` is in flight, or settled and not yet collected by this connector."""
        request = self.requests.requests.get(self._key(dest))
        if request is None or request.future is None:
            return False
        request.connectors.add(self.connector)
        return True

    def _forget(self, needed: Collection[str]) -> None:
        """This connector no longer waits for topics that need no change (any outcome is in the metadata now) or
        that it no longer replicates; a request nobody waits for and not in flight is dropped."""
        for key, request in list(self.requests.requests.items()):
            if key[0] == self.cluster and key[1] not in needed and not _in_flight(request):
                request.connectors.discard(self.connector)
                if not request.connectors:
                    del self.requests.requests[key]

    def _ask(self, dest: str, kind: Literal["create", "grow"], partitions: int, future: Future[None]) -> None:
        key = self._key(dest)
        earlier = self.requests.requests.get(key)
        self.requests.requests[key] = _Request(
            kind, partitions, datetime.now(UTC), future, {self.connector}, earlier.failure if earlier else None
        )
        future.add_done_callback(lambda _done: self.requests.settled.set())

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
            self._ask(new_topic.topic, "create", new_topic.num_partitions, futures[new_topic.topic])

    def _grow(self, wanted: Mapping[str, int]) -> None:
        futures = self.destination_admin.create_partitions(
            [NewPartitions(dest, count) for dest, count in sorted(wanted.items())], request_timeout=ADMIN_TIMEOUT_S
        )
        for dest, count in sorted(wanted.items()):
            self._ask(dest, "grow", count, futures[dest])

    def _settle(self, dest: str, outcome: TopicSyncOutcome) -> None:
        """What this poll shows of `dest`'s request: its outcome once it has one, else that it is in flight."""
        key = self._key(dest)
        request = self.requests.requests.get(key)
        if request is None or request.future is None:
            return  # not asked this poll: the source topic's configs could not be read (`blocked` says so)
        if not request.future.done():
            outcome.blocked[dest] = request.failure or self._in_flight_reason(dest, request)
            return
        exc = request.future.exception()
        if exc is None:
            del self.requests.requests[key]
            outcome.destination[dest] = request.partitions
            if request.kind == "create":
                outcome.created.append(dest)
                log.info("created destination topic %s (%d partitions)", dest, request.partitions)
            else:
                outcome.grown[dest] = request.partitions
                log.info("grew destination topic %s to %d partitions", dest, request.partitions)
            return
        if request.kind == "create" and _error_code(exc) == KafkaError.TOPIC_ALREADY_EXISTS:
            del self.requests.requests[key]  # created meanwhile: the next poll sees it
            return
        if request.kind == "create":
            needed = missing_acl(exc, "Create", "the destination's Cluster")
            request.failure = f"destination topic {dest!r} could not be created: {broker_reason(exc)}{needed}"
        else:
            request.failure = (
                f"destination topic {dest!r} has {self._partitions(dest)} partitions, the source "
                f"{request.partitions}; adding partitions failed: {broker_reason(exc)}"
                f"{missing_acl(exc, 'Alter', f'Topic {dest!r} at the destination')}"
            )
        request.future = None
        outcome.blocked[dest] = request.failure

    def _in_flight_reason(self, dest: str, request: _Request) -> str:
        # An absolute time: the reason is stored with the held partitions, and an age would be stale once written.
        at = request.requested_at.strftime("%Y-%m-%d %H:%M:%S UTC")
        if request.kind == "create":
            return f"creating destination topic {dest!r} with {request.partitions} partitions (requested at {at})"
        return f"adding partitions to {dest!r}, {self._partitions(dest)} to {request.partitions} (requested at {at})"


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
            needed = missing_acl(exc, "AlterConfigs", f"Topic {dest!r} at the destination")
            problems[dest] = f"config sync of {dest!r} failed: {broker_reason(exc)}{needed}"
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
