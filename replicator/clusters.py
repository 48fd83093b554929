"""Which Kafka cluster a client talks to: its cluster id, read from Metadata.

An alias (`source.cluster.alias`, `target.cluster.alias`) is a display name that operators choose and often
leave at its default, so two different clusters can share one. The cluster id is assigned by Kafka itself and
identifies a cluster, so the cycle guard and the provenance headers use it: a bidirectional pair of connectors
cannot loop whatever their naming policy and aliases.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec, ResourceType

METADATA_TIMEOUT_S = 5.0
# What librdkafka reports only to `error_cb` while it reconnects forever (~20 times a second, never giving up): a
# login refused, a TLS handshake failed (unknown CA, host name not in the certificate, no client certificate).
REFUSALS = frozenset({KafkaError._AUTHENTICATION, KafkaError._SSL})
_SECRET_SETTINGS = ("sasl.password", "ssl.key.password", "ssl.keystore.password", "ssl.key.pem")


def connection_identity(settings: Mapping[str, Any]) -> str:
    """Which cluster and as whom, for messages: `host:port over SASL_SSL as User:name` (never a credential)."""
    protocol = str(settings.get("security.protocol", "PLAINTEXT")).upper()
    who = ""
    if protocol.startswith("SASL") and settings.get("sasl.username"):
        who = f" as User:{settings['sasl.username']}"
    elif protocol == "SSL" and ({"ssl.keystore.location", "ssl.certificate.location"} & settings.keys()):
        who = " with a client certificate"
    return f"{settings.get('bootstrap.servers')} over {protocol}{who}"


class _Refusals:
    """librdkafka's error callback of a `ClusterAdmin`: the cluster's last refusal, its secrets masked.

    Kept apart from the client: a bound method of the client as its own callback is a reference cycle, which only
    Python's cyclic collector breaks, so an admin client made for one request lived on after it (its threads waking,
    reconnecting to a cluster that may be gone) until a full collection. An AdminClient has no `close`: it is
    destroyed when its last reference goes."""

    def __init__(self, secrets: list[str]) -> None:
        self.secrets = secrets
        self.last: str | None = None

    def __call__(self, err: KafkaError) -> None:
        if err.code() in REFUSALS:
            message = err.str()
            for secret in self.secrets:  # librdkafka does not echo them; kept out should that ever change
                message = message.replace(secret, "********")
            self.last = message


class ClusterAdmin(AdminClient):
    """The admin client of one of a connector's clusters, which can say why the cluster refused it."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.identity = connection_identity(settings)
        self._refusals = _Refusals([str(settings[k]) for k in _SECRET_SETTINGS if settings.get(k)])
        conf: dict[str, Any] = {**settings, "error_cb": self._refusals}  # librdkafka takes its callbacks as settings
        super().__init__(conf)

    @property
    def refused(self) -> str | None:
        return self._refusals.last

    def refusal(self) -> str | None:
        """The cluster's last refusal (login or TLS), served from the client's events; None if there was none."""
        self.poll(0)
        return self.refused


def refusal(client: object, role: str) -> str | None:
    """`role`'s cluster refused `client` (a `ClusterAdmin`): which cluster, as whom, and the broker's reason."""
    if isinstance(client, ClusterAdmin) and (refused := client.refusal()):
        return f"{role} cluster ({client.identity}) refused the connection: {refused}"
    return None


class ClusterIdentityError(RuntimeError):
    """A cluster's id could not be read; records must not flow without it (the cycle guard depends on it)."""


class MetadataClient(Protocol):
    def list_topics(self, topic: str | None = None, timeout: float = -1) -> object: ...


def cluster_id(admin: AdminClient, role: str, fallback: str) -> str:
    """The cluster id reported in Metadata (Kafka >= 0.10.1), or `fallback` for a broker that reports none.

    Asks for no topic: a cluster's whole metadata is 100,000 partitions in a large estate."""
    try:
        description = admin.describe_cluster(request_timeout=METADATA_TIMEOUT_S).result()
    except KafkaException as exc:
        why = refusal(admin, role) or f"metadata unavailable: {exc}"
        raise ClusterIdentityError(f"cannot identify the {role} cluster: {why}") from exc
    return description.cluster_id or fallback


@dataclass(frozen=True)
class TopicPartitions:
    """A topic's partition ids, or why it has none (it does not exist, or may not be described)."""

    ids: frozenset[int]
    error: str | None = None


# Errors that concern one topic; any other error fails the whole request (the cluster is unreachable).
TOPIC_ERRORS = {
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.TOPIC_EXCEPTION,
}


def topic_partitions(admin: AdminClient, topics: Iterable[str]) -> dict[str, TopicPartitions]:
    """The partitions of the named topics only, in one Metadata request (raises KafkaException if it fails)."""
    names = sorted(set(topics))
    if not names:
        return {}
    futures = admin.describe_topics(TopicCollection(names), request_timeout=METADATA_TIMEOUT_S)
    found = {}
    for name, future in futures.items():
        try:
            found[name] = TopicPartitions(frozenset(p.id for p in future.result().partitions))
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.code() not in TOPIC_ERRORS:
                raise
            found[name] = TopicPartitions(frozenset(), err.str())
    return found


def log_offsets(
    admin: AdminClient, partitions: Iterable[tuple[str, int]], latest: bool, read_committed: bool = False
) -> dict[tuple[str, int], int]:
    """Where each partition's log begins (or ends, `latest`), in one ListOffsets request per leader.

    A consumer assigned a logical offset (`OFFSET_BEGINNING`, `OFFSET_END`) resolves it itself, partition by
    partition, which for thousands of partitions takes many round trips. Partitions whose answer failed are left out
    (the caller falls back to the logical offset)."""
    spec = OffsetSpec.latest() if latest else OffsetSpec.earliest()
    request = {TopicPartition(topic, partition): spec for topic, partition in partitions}
    if not request:
        return {}
    isolation = IsolationLevel.READ_COMMITTED if read_committed else IsolationLevel.READ_UNCOMMITTED
    try:
        futures = admin.list_offsets(request, isolation_level=isolation, request_timeout=METADATA_TIMEOUT_S)
    except KafkaException:
        return {}
    found = {}
    for tp, future in futures.items():
        try:
            found[(tp.topic, tp.partition)] = future.result().offset
        except KafkaException:
            continue
    return found


@dataclass(frozen=True)
class SizeLimit:
    """The largest record batch a topic accepts: its `max.message.bytes`, or where it sets none the broker's
    `message.max.bytes` (which Kafka reports as the topic's value)."""

    bytes: int
    set_on_topic: bool


def max_message_bytes(admin: AdminClient, topics: Iterable[str]) -> dict[str, SizeLimit]:
    """Each topic's `max.message.bytes`, in one DescribeConfigs request for all of them.

    Topics whose answer failed (a missing ACL, the cluster away) or that report no value (the embedded test broker,
    for a topic created without one) are left out: their limit stays unknown. Kafka 1.0 answers for a topic that
    does not exist with the broker's defaults, so callers ask only for topics they know exist."""
    names = sorted(set(topics))
    if not names:
        return {}
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in names]
    try:
        futures = admin.describe_configs(resources, request_timeout=METADATA_TIMEOUT_S)
    except KafkaException:
        return {}
    found = {}
    for resource, future in futures.items():
        try:
            entry = future.result().get("max.message.bytes")
        except KafkaException:
            continue
        if entry is not None and entry.value is not None and str(entry.value).isdigit():
            found[resource.name] = SizeLimit(int(entry.value), not entry.is_default)
    return found


def settings_key(settings: Mapping[str, str]) -> str:
    """Client settings as a key: the clients kept per cluster (admin, heartbeat producer) are kept per settings."""
    return json.dumps(sorted(settings.items()), default=str)


class MetadataUnavailableError(RuntimeError):
    """A cluster's metadata could not be read; the message names the cluster (never its credentials)."""


@dataclass(frozen=True)
class TopicLayout:
    partitions: int
    replication_factor: int  # replicas of partition 0


@dataclass(frozen=True)
class ClusterView:
    """One Metadata response: the cluster's id, its broker count and its topics."""

    cluster_id: str | None
    brokers: int
    topics: dict[str, TopicLayout]

    def partition_counts(self) -> dict[str, int]:
        return {name: layout.partitions for name, layout in self.topics.items()}


def read_cluster(client: MetadataClient, role: str) -> ClusterView:
    """Read a cluster's metadata; `role` ("source", "destination") names it in errors."""
    try:
        metadata: Any = client.list_topics(timeout=METADATA_TIMEOUT_S)
    except KafkaException as exc:
        raise MetadataUnavailableError(refusal(client, role) or f"{role} cluster metadata unavailable: {exc}") from exc
    topics = {
        name: TopicLayout(len(t.partitions), len(t.partitions[0].replicas) if 0 in t.partitions else 1)
        for name, t in metadata.topics.items()
        if t.error is None
    }
    return ClusterView(metadata.cluster_id, len(metadata.brokers), topics)
