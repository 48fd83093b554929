"""Where a partition without a stored offset starts: `consumer.auto.offset.reset` (earliest or latest), as MirrorMaker
2 documents it, for a new connector, a topic matched later and a partition added to a replicated topic — which
starts at its beginning whatever the policy (docs/CONNECTOR-PROPERTIES.md): it holds only records written while the
connector was replicating its topic, and `latest` must not lose them.

On Apache Kafka (`apache_kafka`): the embedded broker cannot add partitions, and its end offsets are those of a batch's
first record (a `latest` start there would copy part of what came before)."""

from __future__ import annotations

from collections import defaultdict

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.configuration.connector import validate_submission
from replicator.discovery.heartbeats import HEARTBEATS_TOPIC
from replicator.discovery.monitor import KafkaMonitor
from replicator.engine.task import TaskExit
from replicator.state.store import Store
from tests.fixtures.engine_helpers import TaskThread, connector_properties
from tests.fixtures.kafka_helpers import consume_all, create_topics, produce

POLICIES = pytest.mark.parametrize("policy", ["earliest", "latest"])


def _put(store: Store, kafka: StackEndpoints, name: str, policy: str, **extra: str) -> str:
    properties = connector_properties(
        kafka, name, **{"consumer.auto.offset.reset": policy, "emit.heartbeats.enabled": "false", **extra}
    )
    config = validate_submission(properties)
    store.put_connector(config.name, config.raw, config.tasks_max)
    return config.name


def _write(kafka: StackEndpoints, topic: str, partitions: range, label: bytes, count: int = 3) -> list[dict]:
    """`count` records into each of `partitions`, valued `label-<partition>-<i>`."""
    records = [
        {"topic": topic, "partition": p, "value": b"%s-%d-%d" % (label, p, i)} for p in partitions for i in range(count)
    ]
    produce(kafka.source_bootstrap_servers, records)
    return records


def _replicating(runner: TaskThread, *partitions: tuple[str, int]) -> bool:
    """Whether the task has started these partitions (their start positions decided)."""
    started = " ".join(e for e in runner.events if e.startswith("replicating"))
    return all(f"{topic}[{partition}]" in started for topic, partition in partitions)


def _copied(kafka: StackEndpoints, topic: str, partitions: int, expected: list[dict]) -> dict[int, list[bytes]]:
    """The destination's values per partition, once `expected` many arrived (and a second more for any others)."""
    records = consume_all(kafka.destination_bootstrap_servers, topic, partitions, expected=len(expected))
    out: dict[int, list[bytes]] = defaultdict(list)
    for r in records:
        out[r.partition].append(r.value)
    return dict(out)


def _values(records: list[dict]) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = defaultdict(list)
    for r in records:
        out[r["partition"]].append(r["value"])
    return dict(out)


def _committed_all(store: Store, connector: str, topic: str, ends: dict[int, int]) -> bool:
    offsets = store.load_offsets(connector)
    return all(offsets.get((topic, p)) == end for p, end in ends.items())


@POLICIES
def test_a_new_connector_starts_each_partition_where_the_policy_says_and_keeps_that_start(
    apache_kafka: StackEndpoints, store: Store, unique: str, policy: str
) -> None:
    create_topics(apache_kafka.source_bootstrap_servers, {unique: 2})
    create_topics(apache_kafka.destination_bootstrap_servers, {unique: 2})
    old = _write(apache_kafka, unique, range(2), b"old")
    name = _put(store, apache_kafka, unique, policy, **{"topics.whitelist": unique})
    store.write_assignment(name, {0: [(unique, 0), (unique, 1)]})

    first = TaskThread.start(store, name)
    wait_until(lambda: _replicating(first, (unique, 0), (unique, 1)), what="the partitions started")
    # Stopped before any record arrived at latest: where the partitions started is stored all the same, so what
    # is written while no task runs is copied by the next one rather than skipped by a second `latest`.
    assert first.finish() is TaskExit.STOPPED
    if policy == "latest":
        assert store.load_offsets(name) == {(unique, 0): 3, (unique, 1): 3}
    down = _write(apache_kafka, unique, range(2), b"down")
    second = TaskThread.start(store, name)
    new = _write(apache_kafka, unique, range(2), b"new")
    wait_until(lambda: _committed_all(store, name, unique, {0: 9, 1: 9}), what="every record written since read")
    assert second.finish() is TaskExit.STOPPED

    expected = [*old, *down, *new] if policy == "earliest" else [*down, *new]
    assert _copied(apache_kafka, unique, 2, expected) == _values(expected)


@POLICIES
def test_a_topic_matched_later_starts_where_the_policy_says(
    apache_kafka: StackEndpoints, store: Store, unique: str, policy: str
) -> None:
    first, later = f"{unique}-first", f"{unique}-later"
    create_topics(apache_kafka.source_bootstrap_servers, {first: 1})
    old = _write(apache_kafka, first, range(1), b"old")
    name = _put(store, apache_kafka, unique, policy, **{"topics.regex": f"{unique}-.*"})
    monitor = KafkaMonitor(store)
    monitor.poll(name)  # creates the destination topic and assigns its partition
    runner = TaskThread.start(store, name)
    try:
        wait_until(lambda: _replicating(runner, (first, 0)), what="the first topic started")
        create_topics(apache_kafka.source_bootstrap_servers, {later: 2})
        before = _write(apache_kafka, later, range(2), b"before")  # written before the connector matched it
        monitor.poll(name)
        wait_until(lambda: _replicating(runner, (later, 0), (later, 1)), what="the topic matched later started")
        after = _write(apache_kafka, later, range(2), b"after")
        new = _write(apache_kafka, first, range(1), b"new")
        wait_until(lambda: _committed_all(store, name, later, {0: 6, 1: 6}), what="the later topic read")
        wait_until(lambda: _committed_all(store, name, first, {0: 6}), what="the first topic read")
    finally:
        runner.finish()

    expected_later = [*before, *after] if policy == "earliest" else after
    assert _copied(apache_kafka, later, 2, expected_later) == _values(expected_later)
    expected_first = [*old, *new] if policy == "earliest" else new
    assert _copied(apache_kafka, first, 1, expected_first) == _values(expected_first)


@POLICIES
def test_a_partition_added_to_a_replicated_topic_starts_at_its_beginning_whatever_the_policy(
    apache_kafka: StackEndpoints, store: Store, unique: str, policy: str
) -> None:
    src = apache_kafka.source_bootstrap_servers
    create_topics(src, {unique: 2})
    old = _write(apache_kafka, unique, range(2), b"old")
    name = _put(store, apache_kafka, unique, policy, **{"topics.whitelist": unique})
    monitor = KafkaMonitor(store)
    monitor.poll(name)
    runner = TaskThread.start(store, name)
    try:
        wait_until(lambda: _replicating(runner, (unique, 0), (unique, 1)), what="the partitions started")
        admin = AdminClient({"bootstrap.servers": src})
        admin.create_partitions([NewPartitions(unique, 3)])[unique].result(timeout=30)
        wait_until(lambda: len(admin.list_topics(unique, timeout=10).topics[unique].partitions) == 3, what="grown")
        # Written into the new partition before the platform has seen it, and alongside into the others.
        early = _write(apache_kafka, unique, range(3), b"early")

        def planned() -> bool:
            replicated = monitor.poll(name).plan.replicate
            return sorted(tp for tp in replicated if tp[0] != HEARTBEATS_TOPIC) == [(unique, p) for p in range(3)]

        wait_until(planned, what="the new partition assigned")
        wait_until(lambda: _replicating(runner, (unique, 2)), what="the new partition started")
        late = _write(apache_kafka, unique, range(3), b"late")
        wait_until(lambda: _committed_all(store, name, unique, {0: 9, 1: 9, 2: 6}), what="every record read")
    finally:
        runner.finish()

    expected = [*old, *early, *late] if policy == "earliest" else [*early, *late]
    assert _copied(apache_kafka, unique, 3, expected) == _values(expected)
    if policy == "latest":
        assert f"{unique}[2]: added to a topic already replicated, started at the beginning" in " ".join(runner.events)
