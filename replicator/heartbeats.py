"""Heartbeats per flow (MirrorMaker 2's MirrorHeartbeatConnector) and the flow-liveness figure.

While `emit.heartbeats.enabled`, the monitor writes a heartbeat record into the `heartbeats` topic of the
connector's source cluster (created compacted, one partition, when absent) at most every
`emit.heartbeats.interval.seconds` (in practice at the monitor's pace). Key: the flow (source and target alias
and cluster id); value: the emission time. The connector always replicates its source's `heartbeats` topic, as
MM2 does, so heartbeats travel the same path as every record: read by a task, written to the destination,
acknowledged, committed. The cycle guard keeps a bidirectional pair from sending them back.

Liveness: the monitor remembers the source offsets of the heartbeats it emitted; the newest one below the
connector's committed offset for `heartbeats` has certainly reached the destination. Its age is the flow's
liveness: small while records flow end to end, growing when anything on the path stops.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from replicator.clusters import ClusterView
from replicator.config import ConnectorConfig
from replicator.store import Store

HEARTBEATS_TOPIC = "heartbeats"
KEPT = 20  # heartbeats remembered per flow: plenty to find the newest replicated one
FLUSH_TIMEOUT_S = 5.0


class HeartbeatError(RuntimeError):
    """A heartbeat could not be written; the message carries the broker's reason."""


def emit(
    config: ConnectorConfig, source_admin: AdminClient, source: ClusterView, destination_id: str | None
) -> tuple[int, int]:
    """Write one heartbeat into the source's `heartbeats` topic; returns (offset, timestamp ms)."""
    if HEARTBEATS_TOPIC not in source.topics:
        replicas = max(1, min(3, source.brokers or 1))
        new = NewTopic(HEARTBEATS_TOPIC, 1, replicas, config={"cleanup.policy": "compact"})
        try:
            source_admin.create_topics([new])[HEARTBEATS_TOPIC].result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise HeartbeatError(f"cannot create {HEARTBEATS_TOPIC!r} at the source: {exc.args[0].str()}") from exc
    key = json.dumps({
        "sourceClusterAlias": config.source_alias, "targetClusterAlias": config.target_alias,
        "sourceClusterId": source.cluster_id, "targetClusterId": destination_id, "connector": config.name,
    }, sort_keys=True).encode()  # fmt: skip
    now_ms = time.time_ns() // 1_000_000
    delivered: list[tuple[KafkaError | None, int]] = []
    producer = Producer({**config.admin_settings("source"), "acks": "all", "enable.idempotence": True,
                         "allow.auto.create.topics": False})  # fmt: skip
    producer.produce(HEARTBEATS_TOPIC, json.dumps({"timestamp": now_ms}).encode(), key, partition=0,
                     timestamp=now_ms, on_delivery=lambda err, msg: delivered.append((err, msg.offset())))  # fmt: skip
    producer.flush(FLUSH_TIMEOUT_S)
    if not delivered:
        raise HeartbeatError("heartbeat not acknowledged by the source cluster in time")
    err, offset = delivered[0]
    if err is not None:
        raise HeartbeatError(f"heartbeat refused by the source cluster: {err.str()} ({err.name()})")
    return offset, now_ms


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
