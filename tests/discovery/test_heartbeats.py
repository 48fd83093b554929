"""Heartbeats per flow: emitted at the source, replicated like any record; the flow's liveness is the age of the
newest one known to be at the destination, and it grows when the flow stops."""

from __future__ import annotations

import json
import time

from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.configuration.connector import validate_submission
from replicator.discovery.heartbeats import HEARTBEATS_TOPIC, flow_liveness_s, liveness_s
from replicator.discovery.monitor import KafkaMonitor
from replicator.state.store import Store
from replicator.topics import provenance
from tests.fixtures.engine_helpers import TaskThread, connector_properties
from tests.fixtures.kafka_helpers import cluster_id, consume_all, create_topics


def test_heartbeats_flow_to_the_destination_and_liveness_shows_a_stopped_flow(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    create_topics(stack.source_bootstrap_servers, {unique: 1})
    properties = connector_properties(
        stack,
        unique,
        **{
            "topics.whitelist": unique,
            "emit.heartbeats.interval.seconds": "1",
            "destination.topic.name.suffix": f".{unique}",
        },
    )
    config = validate_submission(properties)
    store.put_connector(config.name, config.raw, config.tasks_max)
    monitor = KafkaMonitor(store)
    wait_until(lambda: (HEARTBEATS_TOPIC, 0) in monitor.poll(unique).plan.replicate, what="heartbeats assigned")
    started_s = time.time()
    runner = TaskThread.start(store, unique)
    try:
        # Liveness is the age of the newest heartbeat known to be at the destination: below the time since the task
        # started, it dates a heartbeat emitted since then. How young it stays is a matter of speed, which a busy
        # shared machine cannot judge: not asserted.

        def crossed_since_start() -> bool:
            monitor.poll(unique)
            age = flow_liveness_s(store, unique)
            return age is not None and age < time.time() - started_s

        wait_until(
            crossed_since_start, timeout=60, interval=0.5, what="a heartbeat emitted since the start, replicated"
        )
    finally:
        runner.finish()
    stopped_s = time.time()
    status = next(s for s in store.connector_statuses() if s.name == unique)  # what the connectors asset shows
    shown = liveness_s(status.heartbeats, status.heartbeats_committed)
    assert shown is not None and shown < time.time() - started_s, f"liveness shown: {shown}"
    assert status.cluster_ids == (
        cluster_id(stack.source_bootstrap_servers),
        cluster_id(stack.destination_bootstrap_servers),
    )
    copies = consume_all(stack.destination_bootstrap_servers, f"{HEARTBEATS_TOPIC}.{unique}", 1, expected=1)
    mine = [r for r in copies if json.loads(r.key)["connector"] == unique]
    assert mine and all(provenance.parse(r.headers).source_topic == HEARTBEATS_TOPIC for r in mine)
    assert json.loads(mine[0].key)["sourceClusterId"] == provenance.parse(mine[0].headers).source_cluster

    # The task is stopped: heartbeats are still emitted but none arrives, so liveness keeps counting from a
    # heartbeat emitted before the stop.
    def emitted_since_stop() -> bool:
        monitor.poll(unique)
        return max(ts for _offset, ts in store.flow(unique).heartbeats) / 1000 > stopped_s

    wait_until(emitted_since_stop, timeout=60, interval=0.5, what="a heartbeat emitted after the task stopped")
    since_stop = time.time() - stopped_s
    age = flow_liveness_s(store, unique)
    assert age is not None and age >= since_stop, f"liveness {age} s, {since_stop} s after the flow stopped"
