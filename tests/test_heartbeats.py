"""Heartbeats per flow: emitted at the source, replicated like any record; the flow's liveness is the age of the
newest one known to be at the destination, and it grows when the flow stops."""

from __future__ import annotations

import json

from confluent_kafka.admin import AdminClient

from mirus_dagster.stack import StackEndpoints
from replicator import provenance
from replicator.config import validate_submission
from replicator.heartbeats import HEARTBEATS_TOPIC, flow_liveness_s, liveness_s
from replicator.monitor import KafkaMonitor
from replicator.store import Store

from .engine_helpers import TaskThread, connector_properties
from .kafka_helpers import consume_all, create_topics, wait_for


def _cluster_id(bootstrap: str) -> str:
    return AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).cluster_id


def test_heartbeats_flow_to_the_destination_and_liveness_shows_a_stopped_flow(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    create_topics(stack.source_bootstrap_servers, {unique: 1})
    properties = connector_properties(stack, unique, **{
        "topics.whitelist": unique, "emit.heartbeats.interval.seconds": "1",
        "destination.topic.name.suffix": f".{unique}",
    })  # fmt: skip
    config = validate_submission(properties)
    store.put_connector(config.name, config.raw, config.tasks_max)
    monitor = KafkaMonitor(store)
    wait_for(lambda: (HEARTBEATS_TOPIC, 0) in monitor.poll(unique).plan.replicate, what="heartbeats assigned")
    runner = TaskThread.start(store, unique)
    try:

        def live() -> bool:
            monitor.poll(unique)
            age = flow_liveness_s(store, unique)
            return age is not None and age < 5

        wait_for(live, timeout=60, interval=0.5, what="a replicated heartbeat younger than 5 s")
    finally:
        runner.finish()
    status = next(s for s in store.connector_statuses() if s.name == unique)  # what the connectors asset shows
    assert liveness_s(status.heartbeats, status.heartbeats_committed) is not None
    assert status.cluster_ids == (
        _cluster_id(stack.source_bootstrap_servers),
        _cluster_id(stack.destination_bootstrap_servers),
    )
    copies = consume_all(stack.destination_bootstrap_servers, f"{HEARTBEATS_TOPIC}.{unique}", 1, expected=1)
    mine = [r for r in copies if json.loads(r.key)["connector"] == unique]
    assert mine and all(provenance.parse(r.headers).source_topic == HEARTBEATS_TOPIC for r in mine)
    assert json.loads(mine[0].key)["sourceClusterId"] == provenance.parse(mine[0].headers).source_cluster

    # The task is stopped: heartbeats are still emitted but none arrives; liveness grows past 3 s.
    emitted = len(store.flow(unique).heartbeats)

    def stalled() -> bool:
        monitor.poll(unique)
        age = flow_liveness_s(store, unique)
        return age is not None and age > 3

    wait_for(stalled, timeout=30, interval=0.5, what="liveness growing while the flow is stopped")
    assert len(store.flow(unique).heartbeats) > emitted  # heartbeats kept being emitted meanwhile
