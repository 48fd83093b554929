"""Destination topics follow their source: created with its partitions and configs, grown with it, configs kept
in sync. What needs Apache Kafka's behaviour (topic configs reported as set, CreatePartitions, replication factors
checked) runs on the `apache_kafka` clusters; a destination that cannot add partitions is an embedded broker
started by its test; the rest runs on the session's clusters. The metadata watcher's rounds never wait for a
growth: shown with the kit's ZooKeeper frozen, which stalls Kafka 1.0's CreatePartitions as a busy controller does."""

from __future__ import annotations

import os
import signal
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    ResourceType,
)

from mirus.faults.brokers import KafkaKit, tansu_broker
from mirus.local.stack import free_port
from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.configuration.connector import validate_submission
from replicator.discovery.heartbeats import HEARTBEATS_TOPIC
from replicator.discovery.monitor import KafkaMonitor
from replicator.discovery.watcher import MetadataWatcher
from replicator.state.records import PartitionHealth
from replicator.state.store import Store
from replicator.topics import provenance
from tests.fixtures.engine_helpers import TaskThread, connector_properties
from tests.fixtures.kafka_helpers import consume_all, create_topics, produce

CONFIGS = {"retention.ms": "3600000", "max.message.bytes": "200000", "cleanup.policy": "delete"}


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def _partitions(bootstrap: str, topic: str) -> int:
    metadata = _admin(bootstrap).list_topics(timeout=10)
    return len(metadata.topics[topic].partitions) if topic in metadata.topics else 0


def _configs(bootstrap: str, topic: str) -> dict[str, object]:
    admin, resource = _admin(bootstrap), ConfigResource(ResourceType.TOPIC, topic)
    return dict(admin.describe_configs([resource])[resource].result())


def _put(store: Store, properties: dict[str, object]) -> str:
    config = validate_submission(properties)
    store.put_connector(config.name, config.raw, config.tasks_max)
    return config.name


def _selected(partitions: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The partitions of selected topics (the flow also carries its source's heartbeats)."""
    return sorted(tp for tp in partitions if tp[0] != HEARTBEATS_TOPIC)


def _held(store: Store, connector: str) -> dict[tuple[str, int], str]:
    return {tp: s.reason for tp, s in store.partition_statuses(connector).items() if s.state == PartitionHealth.PAUSED}


def test_a_topic_created_at_the_source_appears_at_the_destination_and_its_records_flow(
    apache_kafka: StackEndpoints, store: Store, unique: str
) -> None:
    src, dst = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    monitor = KafkaMonitor(store)
    name = _put(
        store,
        connector_properties(
            apache_kafka, unique, **{"topics.regex": f"{unique}-.*", "destination.topic.name.suffix": ".copy"}
        ),
    )
    topic = f"{unique}-new"
    create_topics(src, {topic: 3}, config={**CONFIGS, "min.insync.replicas": "1"})
    produce(src, [{"topic": topic, "partition": i % 3, "key": b"k%d" % i, "value": b"v%d" % i} for i in range(90)])

    result = monitor.poll(name)
    assert _partitions(dst, f"{topic}.copy") == 3
    assert _selected(result.plan.replicate) == [(topic, p) for p in range(3)]
    runner = TaskThread.start(store, name)
    try:
        copied = consume_all(dst, f"{topic}.copy", 3, expected=90)
    finally:
        runner.finish()
    assert len(copied) == 90
    assert all(provenance.parse(r.headers).source_partition == r.partition for r in copied)

    copied_configs = _configs(dst, f"{topic}.copy")
    assert {k: copied_configs[k].value for k in CONFIGS} == CONFIGS
    assert all(not copied_configs[k].is_default for k in CONFIGS)
    assert copied_configs["min.insync.replicas"].is_default  # excluded, as MM2's DefaultConfigPropertyFilter


def test_creation_switched_off_holds_partitions_with_the_reason(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    name = _put(
        store, connector_properties(stack, unique, **{"topics.whitelist": unique, "topic.creation.enable": "false"})
    )
    create_topics(stack.source_bootstrap_servers, {unique: 2})
    KafkaMonitor(store).poll(name)
    assert _partitions(stack.destination_bootstrap_servers, unique) == 0
    assert {tp: reason for tp, reason in _held(store, name).items() if tp[0] == unique} == {
        (unique, p): f"destination partition {unique}[{p}] does not exist (topic.creation.enable=false)"
        for p in range(2)
    }


def test_a_creation_failure_is_shown_with_the_brokers_reason(
    apache_kafka: StackEndpoints, store: Store, unique: str
) -> None:
    # A replication factor no single-broker cluster can satisfy: the broker refuses and says why.
    name = _put(
        store, connector_properties(apache_kafka, unique, **{"topics.whitelist": unique, "replication.factor": "3"})
    )
    create_topics(apache_kafka.source_bootstrap_servers, {unique: 1})
    KafkaMonitor(store).poll(name)
    assert _partitions(apache_kafka.destination_bootstrap_servers, unique) == 0
    reason = _held(store, name)[(unique, 0)]
    assert reason.startswith(f"destination topic {unique!r} could not be created: ")
    assert "(" in reason and reason.endswith(")")  # the broker's error name


def _grow(bootstrap: str, topic: str, count: int) -> KafkaError | None:
    """Add partitions; the broker's error when it cannot (e.g. no CreatePartitions support)."""
    admin = _admin(bootstrap)
    try:
        admin.create_partitions([NewPartitions(topic, count)])[topic].result()
    except KafkaException as exc:
        return exc.args[0]
    return None


def test_a_grown_source_topic_keeps_every_record_in_its_own_partition(
    apache_kafka: StackEndpoints, store: Store, unique: str
) -> None:
    src, dst = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    monitor = KafkaMonitor(store)
    name = _put(store, connector_properties(apache_kafka, unique, **{"topics.whitelist": unique}))
    create_topics(src, {unique: 2})
    monitor.poll(name)
    runner = TaskThread.start(store, name)
    try:
        produce(src, [{"topic": unique, "partition": i % 2, "value": b"before-%d" % i} for i in range(20)])
        assert _grow(src, unique, 4) is None
        wait_until(lambda: _partitions(src, unique) == 4, what="source grown to 4")
        # Records for the new partitions are written before the monitor has seen them.
        produce(src, [{"topic": unique, "partition": i % 4, "value": b"after-%d" % i} for i in range(40)])
        wait_until(
            lambda: _selected(monitor.poll(name).plan.replicate) == [(unique, p) for p in range(4)],
            what="monitor assigns 4 partitions",
        )
        assert _partitions(dst, unique) == 4
        copied = consume_all(dst, unique, 4, expected=60)
    finally:
        runner.finish()
    source = consume_all(src, unique, 4, expected=60)
    by_partition: dict[int, list[bytes]] = defaultdict(list)
    for r in source:
        by_partition[r.partition].append(r.value)
    assert len(copied) == 60
    for r in copied:
        assert provenance.parse(r.headers).source_partition == r.partition
    assert {p: [r.value for r in copied if r.partition == p] for p in range(4)} == dict(by_partition)


def test_a_destination_with_fewer_partitions_than_its_source_is_grown(
    apache_kafka: StackEndpoints, store: Store, unique: str
) -> None:
    src, dst = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    create_topics(src, {unique: 4})
    create_topics(dst, {unique: 2})  # as if the source had grown from 2 to 4 partitions
    produce(src, [{"topic": unique, "partition": i % 4, "value": b"v%d" % i} for i in range(40)])
    name = _put(store, connector_properties(apache_kafka, unique, **{"topics.whitelist": unique}))
    result = KafkaMonitor(store).poll(name)
    assert _partitions(dst, unique) == 4
    assert _selected(result.plan.replicate) == [(unique, p) for p in range(4)]
    runner = TaskThread.start(store, name)
    try:
        copied = consume_all(dst, unique, 4, expected=40)
    finally:
        runner.finish()
    assert sorted(r.value for r in copied) == sorted(b"v%d" % i for i in range(40))
    assert all(provenance.parse(r.headers).source_partition == r.partition for r in copied)


@contextmanager
def controller_stalled(kit: KafkaKit) -> Iterator[None]:
    """ZooKeeper stopped (SIGSTOP, by its pid) and then continued: meanwhile Kafka 1.0 brokers serve metadata from
    their caches, but a CreatePartitions, which writes to ZooKeeper, waits, as behind a controller adding thousands
    of partitions. Kept to a few seconds: the brokers' ZooKeeper sessions (6 s) must not expire."""
    assert kit.zookeeper is not None
    os.kill(kit.zookeeper.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(kit.zookeeper.pid, signal.SIGCONT)


def _assigned(store: Store, connector: str) -> list[tuple[str, int]]:
    return _selected([tp for partitions in store.read_assignment(connector).values() for tp in partitions])


def test_a_pending_destination_growth_holds_up_no_other_connectors_discovery(
    apache_kafka: StackEndpoints, kafka_kit: KafkaKit, stack: StackEndpoints, store: Store, unique: str
) -> None:
    grown, other = f"{unique}-a", f"{unique}-b"
    src, dst = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    create_topics(src, {grown: 2})
    create_topics(dst, {grown: 2})
    # No periodic duty of `grown`'s connector reads topic configs (ZooKeeper) while ZooKeeper is stopped.
    quiet = {
        "emit.heartbeats.enabled": "false",
        "emit.checkpoints.enabled": "false",
        "sync.topic.configs.enabled": "false",
        "monitor.poll.wait.ms": "600000",
    }
    _put(store, connector_properties(apache_kafka, grown, **{"topics.whitelist": grown, **quiet}))
    _put(store, connector_properties(stack, other, **{"topics.regex": f"{other}-.*", "monitor.poll.wait.ms": "600000"}))
    watcher = MetadataWatcher(store)
    wait_until(
        lambda: watcher.watch_once() and _assigned(store, grown) == [(grown, 0), (grown, 1)], what="the topic assigned"
    )
    assert _grow(src, grown, 4) is None
    wait_until(lambda: _partitions(src, grown) == 4, what="source grown to 4")
    create_topics(stack.destination_bootstrap_servers, {f"{other}-new": 1})
    create_topics(stack.source_bootstrap_servers, {f"{other}-new": 1})

    with controller_stalled(kafka_kit):
        stalled_round = watcher.watch_once()
        # Polled in name order: the other connector's discovery came after the growth was asked, in the same round,
        # and the round returned with the growth in flight.
        assert [name for name in stalled_round.polled if name in (grown, other)] == [grown, other]
        assert other in [r.connector for r in stalled_round.changed]
        assert _assigned(store, other) == [(f"{other}-new", 0)]
        held = _held(store, grown)
        assert set(held) == {(grown, 2), (grown, 3)}
        assert all(
            reason.startswith(f"adding partitions to {grown!r}, 2 to 4 (requested at ") for reason in held.values()
        )
        assert _assigned(store, grown) == [(grown, 0), (grown, 1)]

    wait_until(
        lambda: watcher.watch_once() and _assigned(store, grown) == [(grown, p) for p in range(4)],
        what="the grown partitions assigned",
    )
    assert _partitions(dst, grown) == 4


@pytest.fixture
def destination_without_create_partitions(tmp_path: Path) -> Iterator[str]:
    """A destination cluster whose broker cannot add partitions: the embedded broker (no CreatePartitions), started
    here so that the test proves the held-back path whichever clusters the suite runs on."""
    broker = tansu_broker("destination-fixed", port := free_port(), port, tmp_path / "tansu.log")
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def test_a_destination_that_cannot_grow_holds_only_the_new_partitions(
    stack: StackEndpoints, destination_without_create_partitions: str, store: Store, unique: str
) -> None:
    src, dst = stack.source_bootstrap_servers, destination_without_create_partitions
    create_topics(src, {unique: 4})
    create_topics(dst, {unique: 2})  # as if the source had grown from 2 to 4 partitions
    produce(src, [{"topic": unique, "partition": i % 4, "value": b"v%d" % i} for i in range(40)])
    endpoints = StackEndpoints(src, dst, stack.database_url)
    name = _put(store, connector_properties(endpoints, unique, **{"topics.whitelist": unique}))
    result = KafkaMonitor(store).poll(name)
    runner = TaskThread.start(store, name)
    try:
        # Partitions 2 and 3 wait with the broker's reason; 0 and 1 flow.
        assert _partitions(dst, unique) == 2
        assert _selected(result.plan.replicate) == [(unique, 0), (unique, 1)]
        held = {tp: reason for tp, reason in _held(store, name).items() if tp[0] == unique}
        assert set(held) == {(unique, 2), (unique, 3)}
        for reason in held.values():
            assert reason.startswith(
                f"destination topic {unique!r} has 2 partitions, the source 4; adding partitions failed: "
            )
            assert "CreatePartitions" in reason and "_UNSUPPORTED_FEATURE" in reason
        copied = consume_all(dst, unique, 2, expected=20)
    finally:
        runner.finish()
    assert sorted(r.value for r in copied) == sorted(b"v%d" % i for i in range(40) if i % 4 < 2)
    assert all(provenance.parse(r.headers).source_partition == r.partition for r in copied)


def _set_config(bootstrap: str, topic: str, name: str, value: str) -> None:
    admin = _admin(bootstrap)
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)],
    )
    try:
        admin.incremental_alter_configs([resource])[resource].result()
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError._UNSUPPORTED_FEATURE:
            raise
        current = {k: e.value for k, e in _configs(bootstrap, topic).items() if not e.is_default}
        legacy = ConfigResource(ResourceType.TOPIC, topic, set_config={**current, name: value})
        admin.alter_configs([legacy])[legacy].result()


def test_a_source_config_change_propagates(apache_kafka: StackEndpoints, store: Store, unique: str) -> None:
    src, dst = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    create_topics(src, {unique: 1}, config=CONFIGS)
    name = _put(
        store,
        connector_properties(
            apache_kafka, unique, **{"topics.whitelist": unique, "sync.topic.configs.interval.seconds": "1"}
        ),
    )
    monitor = KafkaMonitor(store)
    monitor.poll(name)
    assert _configs(dst, unique)["retention.ms"].value == "3600000"
    _set_config(src, unique, "retention.ms", "7200000")
    _set_config(src, unique, "min.insync.replicas", "1")  # excluded: never copied

    def propagated() -> bool:
        monitor.poll(name)
        return _configs(dst, unique)["retention.ms"].value == "7200000"

    wait_until(propagated, timeout=30, interval=0.5, what="retention.ms at the destination")
    assert _configs(dst, unique)["min.insync.replicas"].is_default
    assert store.flow(name).problems == {}
