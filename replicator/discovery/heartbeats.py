"""Heartbeats per flow (MirrorMaker 2's MirrorHeartbeatConnector) and the flow-liveness figure.

While `emit.heartbeats.enabled`, the monitor writes a heartbeat record into the `heartbeats` topic of the
connector's source cluster (created compacted, one partition, when absent) at most every
`emit.heartbeats.interval.seconds` (in practice at the monitor's pace). Key: the flow (source and target alias
and cluster id); value: the emission time. The connector always replicates its source's `heartbeats` topic, as
MM2 does, so heartbeats travel the same path as every record: read by a task, written to the destination,
acknowledged, committed. The cycle guard keeps a bidirectional pair from sending them back.

The records are written by one long-lived producer per source cluster (`HeartbeatProducers`) and never waited for
inside the metadata watcher's round: each heartbeat's acknowledgement is collected on the flow's next poll.

Liveness: the monitor remembers the source offsets of the heartbeats acknowledged (the offset comes with the
acknowledgement); the newest one below the connector's committed offset for `heartbeats` has certainly reached the
destination. Its age is the flow's
liveness: small while records flow end to end, growing when anything on the path stops.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from replicator.clusters import ClusterView, settings_key
from replicator.configuration.connector import ConnectorConfig
from replicator.state.store import Store

HEARTBEATS_TOPIC = "heartbeats"
KEPT = 20  # heartbeats remembered per flow: plenty to find the newest replicated one
FLUSH_TIMEOUT_S = 5.0
# A heartbeat not acknowledged within this is reported as failed (and the flow may emit the next one).
DELIVERY_TIMEOUT_MS = 10_000


class HeartbeatError(RuntimeError):
    """A heartbeat could not be written; the message carries the broker's reason."""


@dataclass(frozen=True)
class Delivery:
    """What became of one heartbeat: its offset and emission time, or the reason it was not written."""

    offset: int | None  # None if it was not written
    timestamp_ms: int
    error: str | None = None


class HeartbeatProducers:
    """One long-lived idempotent producer per source cluster (and client settings), shared by every flow from it.

    `emit` only queues the record; its outcome arrives on a later `collect` (`poll(0)`), so the metadata watcher's
    round never waits for a source cluster's acknowledgement, nor for a producer's connection and InitProducerId.
    At most one heartbeat per flow is in flight. `wait`: `emit` waits for the acknowledgement, for a monitor used on
    its own (one poll then remembers the heartbeat it emitted)."""

    def __init__(self, *, wait: bool = False) -> None:
        self.wait = wait
        self.producers: dict[str, Producer] = {}
        self.in_flight: set[str] = set()  # connectors whose heartbeat awaits its outcome
        self.delivered: dict[str, list[Delivery]] = {}  # connector -> outcomes not collected yet
        self.fatal: set[str] = set()  # producers to replace (not from inside their own delivery callback)

    def emit(
        self, config: ConnectorConfig, source_admin: AdminClient, source: ClusterView, destination_id: str | None
    ) -> bool:
        """Queue one heartbeat into the source's `heartbeats` topic, unless the flow's previous one is still in
        flight; returns whether one was queued."""
        if config.name in self.in_flight:
            return False
        if HEARTBEATS_TOPIC not in source.topics:
            _create_topic(source_admin, source)
        key = json.dumps(
            {
                "sourceClusterAlias": config.source_cluster_alias,
                "targetClusterAlias": config.target_cluster_alias,
                "sourceClusterId": source.cluster_id,
                "targetClusterId": destination_id,
                "connector": config.name,
            },
            sort_keys=True,
        ).encode()
        now_ms = time.time_ns() // 1_000_000
        connector = config.name
        # The callback holds the outcomes' containers, not `self`: a record in flight holds its callback, and
        # through `self` the callback would hold the producer itself, a cycle no collector sees (librdkafka holds
        # the record), so producers dropped with heartbeats in flight would never be destroyed.
        in_flight, outcomes, fatal = self.in_flight, self.delivered, self.fatal

        def delivered(err: KafkaError | None, msg: Message) -> None:
            in_flight.discard(connector)
            reason = None if err is None else f"heartbeat refused by the source cluster: {err.str()} ({err.name()})"
            outcomes.setdefault(connector, []).append(Delivery(msg.offset(), now_ms, reason))
            if err is not None and err.fatal():  # an idempotent producer that hit a fatal error never recovers
                fatal.add(settings_key(config.admin_settings("source")))

        self._poll()  # a producer that failed fatally is replaced before it is used again
        producer = self._producer(config)
        try:
            producer.produce(
                HEARTBEATS_TOPIC,
                json.dumps({"timestamp": now_ms}).encode(),
                key,
                partition=0,
                timestamp=now_ms,
                on_delivery=delivered,
            )
        except BufferError as exc:
            raise HeartbeatError(f"heartbeat not queued: {exc}") from exc
        except KafkaException as exc:
            if exc.args[0].fatal():
                self._replace(settings_key(config.admin_settings("source")))
            raise HeartbeatError(f"heartbeat not queued: {exc.args[0].str()} ({exc.args[0].name()})") from exc
        self.in_flight.add(connector)
        if self.wait:
            producer.flush(FLUSH_TIMEOUT_S)
        return True

    def collect(self, connector: str) -> list[Delivery]:
        """The outcomes of the flow's heartbeats that arrived since the last collect, oldest first."""
        self._poll()
        return self.delivered.pop(connector, [])

    def keep(self, connectors: Collection[str], settings_keys: Collection[str]) -> None:
        """Forget flows no longer running and close the producers of source clusters no running flow reads."""
        for key in set(self.producers) - set(settings_keys):
            self._replace(key)
        for gone in set(self.delivered) - set(connectors):  # in place: callbacks in flight hold these containers
            del self.delivered[gone]
        self.in_flight &= set(connectors)

    def _poll(self) -> None:
        """Run the delivery callbacks of every producer, then replace those that failed fatally."""
        for producer in self.producers.values():
            producer.poll(0)
        fatal = set(self.fatal)  # a purge's callbacks may name the producer again
        self.fatal.clear()
        for key in fatal:
            self._replace(key)

    def _producer(self, config: ConnectorConfig) -> Producer:
        settings = config.admin_settings("source")
        key = settings_key(settings)
        producer = self.producers.get(key)
        if producer is None:
            producer = self.producers[key] = Producer(
                {
                    **settings,
                    "acks": "all",
                    "enable.idempotence": True,
                    "allow.auto.create.topics": False,
                    "message.timeout.ms": DELIVERY_TIMEOUT_MS,
                }
            )
        return producer

    def close(self) -> None:
        """Close every producer (the watcher stops); heartbeats still in flight are reported failed (purged)."""
        for key in list(self.producers):
            self._replace(key)

    def _replace(self, key: str) -> None:
        """Close a producer; its queued and in-flight heartbeats are reported failed (purged) on the way out."""
        producer = self.producers.pop(key, None)
        if producer is not None:
            producer.purge()
            producer.close()  # serves the purged heartbeats' delivery reports, then destroys the client


def _create_topic(source_admin: AdminClient, source: ClusterView) -> None:
    replicas = max(1, min(3, source.brokers or 1))
    new = NewTopic(HEARTBEATS_TOPIC, 1, replicas, config={"cleanup.policy": "compact"})
    try:
        source_admin.create_topics([new])[HEARTBEATS_TOPIC].result()
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise HeartbeatError(f"cannot create {HEARTBEATS_TOPIC!r} at the source: {exc.args[0].str()}") from exc


def remember(previous: Sequence[Sequence[int]], offset: int, timestamp_ms: int) -> list[list[int]]:
    return [*([list(h) for h in previous][-(KEPT - 1) :]), [offset, timestamp_ms]]


def liveness_s(emitted: Sequence[Sequence[int]], committed: int | None, now_s: float | None = None) -> float | None:
    """Seconds since the newest heartbeat known to be at the destination was emitted; None before the first.

    `emitted`: the flow's recent heartbeats ([offset, timestamp ms]); `committed`: the connector's committed offset
    in the heartbeats partition (every heartbeat below it has been acknowledged by the destination)."""
    if not emitted or committed is None:
        return None
    arrived = [ts for offset, ts in emitted if offset < committed]
    # None of the remembered ones arrived: the flow has been stuck at least since the oldest was emitted.
    newest = max(arrived) if arrived else min(ts for _offset, ts in emitted)
    now = datetime.now(UTC).timestamp() if now_s is None else now_s
    return max(0.0, now - newest / 1000)


def flow_liveness_s(store: Store, connector: str) -> float | None:
    """`liveness_s` of one connector, read from Postgres."""
    committed = store.load_offsets(connector, [(HEARTBEATS_TOPIC, 0)]).get((HEARTBEATS_TOPIC, 0))
    return liveness_s(store.flow(connector).heartbeats, committed)
