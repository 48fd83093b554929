"""Failover: a consumer group's source offsets translated to the destination exactly, with `mirus offsets
translate`; an active destination group is never overwritten."""

from __future__ import annotations

import time

from click.testing import CliRunner
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from sqlalchemy import text

from mirus.cli.main import main
from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.configuration.connector import ConnectorConfig, validate_submission
from replicator.discovery.monitor import KafkaMonitor
from replicator.discovery.offset_translation import sync_groups
from replicator.state.records import CopySegment
from replicator.state.store import Store
from replicator.topics import provenance
from tests.fixtures.engine_helpers import TaskThread, connector_properties
from tests.fixtures.kafka_helpers import cluster_id, consume_all, create_topics, produce


def _put(store: Store, properties: dict[str, object]) -> ConnectorConfig:
    config = validate_submission(properties)
    store.put_connector(config.name, config.raw, config.tasks_max)
    return config


def _one_partition_flow(stack: StackEndpoints, store: Store, topic: str, records: int, **extra: str) -> ConnectorConfig:
    """Topic `topic` (one partition, `records` records v0, v1, …) at the source and a connector named after it,
    whose destination topic the monitor has created."""
    create_topics(stack.source_bootstrap_servers, {topic: 1})
    produce(stack.source_bootstrap_servers, [{"topic": topic, "value": b"v%d" % i} for i in range(records)])
    config = _put(store, connector_properties(stack, topic, **{"topics.whitelist": topic, **extra}))
    KafkaMonitor(store).poll(config.name)
    return config


def _replicate_until(store: Store, connector: str, ends: dict[tuple[str, int], int]) -> None:
    runner = TaskThread.start(store, connector)
    try:
        wait_until(
            lambda: all(store.load_offsets(connector).get(tp) == end for tp, end in ends.items()),
            timeout=60,
            what=f"{connector} replicated up to {ends}",
        )
    finally:
        runner.finish()


def _rewind(store: Store, connector: str, offsets: dict[tuple[str, int], int]) -> None:
    """Move the connector's committed offsets back (its tasks stopped), as a crash before a commit would."""
    with store.engine.begin() as conn:
        for (topic, partition), offset in offsets.items():
            conn.execute(
                text("UPDATE offsets SET positions[:p + 1] = :o WHERE connector = :c AND topic = :t"),
                {"o": offset, "c": connector, "t": topic, "p": partition},
            )


def _consume_exactly(bootstrap: str, group: str, topic: str, counts: dict[int, int]) -> list[bytes]:
    """Read the first `counts[p]` records of each partition as group `group` and commit where it stopped."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    values: list[bytes] = []
    try:
        for partition, count in counts.items():
            consumer.assign([TopicPartition(topic, partition, 0)])
            got = []
            deadline = time.monotonic() + 30
            while len(got) < count and time.monotonic() < deadline:
                got += [m for m in consumer.consume(count - len(got), 1.0) if m.error() is None]
            assert len(got) == count
            values += [m.value() for m in got]
            consumer.commit(offsets=[TopicPartition(topic, partition, got[-1].offset() + 1)], asynchronous=False)
    finally:
        consumer.close()
    return values


def _continue(bootstrap: str, group: str, topic: str, count: int) -> list[bytes]:
    """Read `count` more records of partition 0 as `group` from its committed offset, and commit."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        committed = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        consumer.assign(committed)
        got: list = []
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            got += [m for m in consumer.consume(count - len(got), 1.0) if m.error() is None]
        assert len(got) == count
        consumer.commit(offsets=[TopicPartition(topic, 0, got[-1].offset() + 1)], asynchronous=False)
    finally:
        consumer.close()
    return [m.value() for m in got]


def _resume_as_group(bootstrap: str, group: str, topic: str, partitions: int) -> list[bytes]:
    """What the group reads at `bootstrap` from its committed offsets to the end of each partition."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False, "enable.partition.eof": True}
    )
    values: list[bytes] = []
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        assert all(tp.offset >= 0 for tp in committed), committed
        consumer.assign(committed)
        open_partitions = set(range(partitions))
        deadline = time.monotonic() + 30
        while open_partitions and time.monotonic() < deadline:
            for msg in consumer.consume(500, 1.0):
                if msg.error() is not None and msg.error().code() == KafkaError._PARTITION_EOF:
                    open_partitions.discard(msg.partition())
                elif msg.error() is None:
                    values.append(msg.value())
        assert not open_partitions
    finally:
        consumer.close()
    return values


def _translate(stack: StackEndpoints, connector: str, group: str, *extra: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(
        main,
        [
            "offsets",
            "translate",
            "--connector",
            connector,
            "--group",
            group,
            "--database-url",
            stack.database_url,
            *extra,
        ],
    )
    return result.exit_code, result.stdout, result.stderr


def test_a_group_resumes_at_the_destination_with_nothing_skipped_and_nothing_reread(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    src, dst = stack.source_bootstrap_servers, stack.destination_bootstrap_servers
    topic, group = unique, f"{unique}-app"
    create_topics(src, {topic: 2})
    produce(src, [{"topic": topic, "partition": i % 2, "value": b"v%03d" % i} for i in range(200)])
    config = _put(store, connector_properties(stack, unique, **{"topics.whitelist": topic}))
    KafkaMonitor(store).poll(config.name)  # creates the destination topic and assigns both partitions
    _replicate_until(store, config.name, {(topic, 0): 100, (topic, 1): 100})
    # An at-least-once replay, as after a crash: the replicator rewinds and writes 70 + 40 records a second time.
    _rewind(store, config.name, {(topic, 0): 30, (topic, 1): 60})
    _replicate_until(store, config.name, {(topic, 0): 100, (topic, 1): 100})

    consumed = _consume_exactly(src, group, topic, {0: 37, 1: 71})
    code, out, err = _translate(stack, config.name, group, "--apply")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "group,topic,partition,source_offset,destination_topic,destination_partition,destination_offset"
    # Partition 0: 100 copies, then the replay of 30..99; the group resumes after the second copy of offset 36.
    assert lines[1:] == [
        f"{group},{topic},0,37,{topic},0,{100 + 37 - 30}",
        f"{group},{topic},1,71,{topic},1,{100 + 71 - 60}",
    ]

    resumed = _resume_as_group(dst, group, topic, 2)
    all_values = {b"v%03d" % i for i in range(200)}
    reread = set(consumed) & set(resumed)
    skipped = all_values - set(consumed) - set(resumed)
    assert (len(reread), len(skipped)) == (0, 0)
    assert len(resumed) == 200 - len(consumed)  # and nothing read twice at the destination
    assert [(c.topic, c.partition, c.destination_offset) for c in store.checkpoints(config.name, group)] == [
        (topic, 0, 107),
        (topic, 1, 111),
    ]


def _group_state(admin: AdminClient, group: str) -> ConsumerGroupState:
    return admin.describe_consumer_groups([group])[group].result().state


def _destination_offsets(admin: AdminClient, group: str) -> dict[int, int]:
    result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result()
    return {tp.partition: tp.offset for tp in result.topic_partitions}


def test_a_destination_group_with_active_members_is_not_overwritten(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    src, dst = stack.source_bootstrap_servers, stack.destination_bootstrap_servers
    topic, group = unique, f"{unique}-app"
    config = _one_partition_flow(stack, store, unique, 20, **{"sync.group.offsets.enabled": "true"})
    _replicate_until(store, config.name, {(topic, 0): 20})
    _consume_exactly(src, group, topic, {0: 12})

    # An application already running at the destination under the same group name: a subscribed member that has
    # committed its own position.
    member = Consumer(
        {"bootstrap.servers": dst, "group.id": group, "enable.auto.commit": False, "session.timeout.ms": 30000}
    )
    admin = AdminClient({"bootstrap.servers": dst})
    try:
        member.subscribe([topic])

        def joined() -> bool:
            member.poll(0.5)
            return _group_state(admin, group) == ConsumerGroupState.STABLE and bool(member.assignment())

        wait_until(joined, timeout=60, interval=0, what="the destination member joined its group")
        member.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)

        code, out, err = _translate(stack, config.name, group, "--apply")
        assert code == 1 and "is active (STABLE" in err, err
        assert out.splitlines()[1] == f"{group},{topic},0,12,{topic},0,12"  # translated, shown, not written
        problems = sync_groups(config, store, cluster_id(src), cluster_id(dst))
        assert "is active" in problems[group]
        assert _destination_offsets(admin, group) == {0: 3}
    finally:
        member.close()

    wait_until(lambda: _group_state(admin, group) == ConsumerGroupState.EMPTY, timeout=60, what="group empty")
    assert sync_groups(config, store, cluster_id(src), cluster_id(dst)) == {}
    assert _destination_offsets(admin, group) == {0: 12}


def _identity(stack: StackEndpoints, name: str, source: str, destination: str, topic: str) -> dict[str, object]:
    return {
        "name": name,
        "source.cluster.bootstrap.servers": source,
        "target.cluster.bootstrap.servers": destination,
        "topics": topic,
        "replication.policy.class": "IdentityReplicationPolicy",
        "offset.flush.interval.ms": "200",
        "emit.heartbeats.enabled": "false",
    }


def test_failover_then_failback_with_identity_naming_skips_and_rereads_nothing(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    a, b = stack.source_bootstrap_servers, stack.destination_bootstrap_servers
    topic = unique
    early, late = f"{unique}-early", f"{unique}-late"  # two applications (groups) failing back at different points
    create_topics(a, {topic: 1})
    forward = _put(store, _identity(stack, f"{unique}-ab", a, b, topic))
    backward = _put(store, _identity(stack, f"{unique}-ba", b, a, topic))
    produce(a, [{"topic": topic, "value": b"a%02d" % i} for i in range(50)])
    KafkaMonitor(store).poll(forward.name)  # creates the topic at b
    _replicate_until(store, forward.name, {(topic, 0): 50})
    read_at_a = {g: _consume_exactly(a, g, topic, {0: 20}) for g in (early, late)}

    # Failover: a is "lost"; both groups move to b.
    for group in (early, late):
        code, _out, err = _translate(stack, forward.name, group, "--apply")
        assert code == 0, err
    read_at_b = {
        early: _continue(b, early, topic, 10),  # stops among the copies of a's records
        late: _continue(b, late, topic, 30),
    }  # all of a's records
    produce(b, [{"topic": topic, "value": b"b%02d" % i} for i in range(40)])  # new traffic lands on b
    read_at_b[late] += _continue(b, late, topic, 15)  # stops among b's own records

    # Failback: the reverse flow copies b's own records to a (never a's copies: their origin is a).
    KafkaMonitor(store).poll(backward.name)
    _replicate_until(store, backward.name, {(topic, 0): 90})
    for group in (early, late):
        code, _out, err = _translate(stack, backward.name, group, "--apply")
        assert code == 0, err
    everything = {b"a%02d" % i for i in range(50)} | {b"b%02d" % i for i in range(40)}
    for group in (early, late):
        processed = read_at_a[group] + read_at_b[group]
        resumed = _resume_as_group(a, group, topic, 1)
        reread = set(processed) & set(resumed)
        skipped = everything - set(processed) - set(resumed)
        assert (len(reread), len(skipped), len(resumed)) == (0, 0, 90 - len(processed)), group
    assert len(consume_all(a, topic, 1, expected=90)) == 90  # and nothing looped back


def test_a_translation_is_applied_only_once_the_destination_holds_what_the_group_processed(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    src, dst = stack.source_bootstrap_servers, stack.destination_bootstrap_servers
    topic, group = unique, f"{unique}-app"
    config = _one_partition_flow(stack, store, unique, 10)
    _consume_exactly(src, group, topic, {0: 5})  # the group is ahead of the (not yet started) replication

    code, _out, err = _translate(stack, config.name, group, "--apply")
    assert code == 1
    assert f"{topic}[0]: the destination does not yet hold every record before offset 5" in err
    assert _destination_offsets(AdminClient({"bootstrap.servers": dst}), group) == {}
    assert store.checkpoints(config.name, group) == []

    _replicate_until(store, config.name, {(topic, 0): 10})
    code, out, err = _translate(stack, config.name, group, "--apply")
    assert code == 0, err
    assert out.splitlines()[1] == f"{group},{topic},0,5,{topic},0,5"
    assert _resume_as_group(dst, group, topic, 1) == [b"v%d" % i for i in range(5, 10)]


def _transactions(bootstrap: str, topic: str, transactions: int, size: int) -> None:
    """`transactions` committed transactions of `size` records into partition 0 of `topic`, each record's value its
    offset (each transaction's commit marker takes the offset after its records)."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic})
    producer.init_transactions(30)
    for t in range(transactions):
        producer.begin_transaction()
        for i in range(size):
            producer.produce(topic, b"v%02d" % (t * (size + 1) + i), partition=0)
        producer.commit_transaction(30)


def test_copies_made_as_record_batches_translate_exactly_through_their_segments(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    """Copies made as record batches carry no header: the segments committed with the offsets translate them, in a
    partition that also holds record-path copies (with headers), after a replay, and for a group whose offset falls
    between two segments (a transaction marker's offset, which no batch copies)."""
    src, dst = stack.source_bootstrap_servers, stack.destination_bootstrap_servers
    topic = unique
    create_topics(src, {topic: 1})
    _transactions(src, topic, 3, 10)  # records 0..9, 11..20, 22..31; markers at 10, 21, 32
    config = _put(store, connector_properties(stack, unique, **{"topics.whitelist": topic}))
    KafkaMonitor(store).poll(config.name)  # creates the destination topic
    source_id = cluster_id(src)

    def copies(offsets: range, headers: bool = False) -> list[dict[str, object]]:
        return [
            {
                "topic": topic,
                "partition": 0,
                "value": b"v%02d" % o,
                "headers": provenance.copy_headers(None, source_id, topic, 0, o) if headers else None,
            }
            for o in offsets
        ]

    # As the batch path and the record path would write them, then commit: 0..9 and 11..20 as batches at 0..19,
    # 22..26 by the record path at 20..24, 27..31 as a batch at 25..29, and again after a restart at 30..34.
    produce(
        dst, copies(range(10)) + copies(range(11, 21)) + copies(range(22, 27), headers=True) + copies(range(27, 32))
    )
    produce(dst, copies(range(27, 32)))
    segments = [CopySegment(topic, 0, s, topic, 0, d, n) for s, d, n in [(0, 0, 10), (11, 10, 10), (27, 25, 5)]]
    lease = store.claim_task(config.name, 0, "batch path")
    store.commit(lease, {(topic, 0): 27}, segments=segments)
    store.commit(lease, {(topic, 0): 33}, segments=[CopySegment(topic, 0, 27, topic, 0, 30, 5)])
    assert len(store.load_segments(config.name)[(topic, 0)]) == 4  # the source's gap at 10 and the record path's

    # Groups that processed 10, 14, 22, 28 and 30 records: committed offsets 10 (the marker), 15, 24, 30, 32.
    expected = {10: 10, 14: 14, 22: 22, 28: 33, 30: 35}
    everything = {b"v%02d" % o for o in [*range(10), *range(11, 21), *range(22, 32)]}
    for count, destination_offset in expected.items():
        group = f"{unique}-{count}"
        consumed = _consume_exactly(src, group, topic, {0: count})
        committed = int(consumed[-1][1:]) + 1
        code, out, err = _translate(stack, config.name, group, "--apply")
        assert code == 0, err
        assert out.splitlines()[1] == f"{group},{topic},0,{committed},{topic},0,{destination_offset}"
        resumed = _resume_as_group(dst, group, topic, 1)
        assert set(consumed) & set(resumed) == set(), f"{group} re-reads"
        assert everything - set(consumed) - set(resumed) == set(), f"{group} skips"
        assert [c.destination_offset for c in store.checkpoints(config.name, group)] == [destination_offset]


def test_failback_through_copies_without_headers_rereads_and_skips_nothing(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    """Identity naming both ways, every copy made as a record batch: a group that failed back while reading copies
    of a's records resumes after their originals at a (found through the forward flow's segments), one that reached
    b's own records after their copies."""
    a, b = stack.source_bootstrap_servers, stack.destination_bootstrap_servers
    topic = unique
    early, late = f"{unique}-early", f"{unique}-late"
    create_topics(a, {topic: 1})
    forward = _put(store, _identity(stack, f"{unique}-ab", a, b, topic))
    backward = _put(store, _identity(stack, f"{unique}-ba", b, a, topic))
    a_records = [{"topic": topic, "value": b"a%02d" % i} for i in range(20)]
    b_records = [{"topic": topic, "value": b"b%02d" % i} for i in range(10)]
    produce(a, a_records)
    KafkaMonitor(store).poll(forward.name)  # creates the topic at b; both flows' cluster ids are recorded
    KafkaMonitor(store).poll(backward.name)
    produce(b, a_records)  # the forward flow's copies: a's 20 records, bytes as they were, no header
    ab = store.claim_task(forward.name, 0, "batch path")
    store.commit(ab, {(topic, 0): 20}, segments=[CopySegment(topic, 0, 0, topic, 0, 0, 20)])

    read_at_a = {group: _consume_exactly(a, group, topic, {0: 12}) for group in (early, late)}
    for group in (early, late):
        code, out, err = _translate(stack, forward.name, group, "--apply")
        assert (code, out.splitlines()[1]) == (0, f"{group},{topic},0,12,{topic},0,12"), err
    read_at_b = {early: _continue(b, early, topic, 8)}  # up to the last copy of a's records
    produce(b, b_records)  # new traffic lands on b
    read_at_b[late] = _continue(b, late, topic, 13)  # into b's own records

    produce(a, b_records)  # failback: the backward flow copies b's own records to a (a's copies it skips)
    ba = store.claim_task(backward.name, 0, "batch path")
    store.commit(ba, {(topic, 0): 30}, segments=[CopySegment(topic, 0, 20, topic, 0, 20, 10)])
    everything = {r["value"] for r in a_records + b_records}
    for group, resumes_at in ((early, 20), (late, 25)):
        code, out, err = _translate(stack, backward.name, group, "--apply")
        assert (code, out.splitlines()[1].rsplit(",", 1)[1]) == (0, str(resumes_at)), err
        processed = read_at_a[group] + read_at_b[group]
        resumed = _resume_as_group(a, group, topic, 1)
        assert (set(processed) & set(resumed), everything - set(processed) - set(resumed)) == (set(), set()), group
        assert len(resumed) == 30 - len(processed)
