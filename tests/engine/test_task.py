"""The task loop against two real clusters and Postgres: records arrive intact, offsets resume, faults stay local."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Producer
from sqlalchemy import text

from mirus.api.metrics import StoreCollector
from mirus.faults.brokers import BrokerProcess, tansu_broker
from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.engine import deliveries, follower
from replicator.engine.metrics import BUCKET_LABELS
from replicator.engine.scheduler import REFRESHING
from replicator.engine.source_reader import TierLimits
from replicator.engine.task import CommitWatchdogError, TaskExit
from replicator.state.head_notices import HeadNotices
from replicator.state.records import ConnectorState
from replicator.state.store import Store
from replicator.topics import provenance
from tests.fixtures.engine_helpers import TaskThread, connector_properties, create_connector, private_database
from tests.fixtures.kafka_helpers import Rec, Traffic, cluster_id, consume_all, create_topics, delete_topics, produce
from tests.fixtures.replica_check import check_replica


def _by_partition(records: list[Rec]) -> dict[int, list[Rec]]:
    out: dict[int, list[Rec]] = defaultdict(list)
    for r in records:
        out[r.partition].append(r)
    return out


def _committed(store: Store, connector: str) -> dict[tuple[str, int], int]:
    return store.load_offsets(connector)


def test_records_arrive_intact_with_partitions_headers_timestamps_and_provenance(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    topic, partitions = unique, 8
    create_topics(stack.source_bootstrap_servers, {topic: partitions})
    create_topics(stack.destination_bootstrap_servers, {f"{topic}.mirror": partitions})
    sent = []
    for i in range(800):
        sent.append(
            {
                "topic": topic,
                "partition": i % partitions,
                "timestamp": 1_700_000_000_000 + i,
                "key": None if i % 7 == 0 else b"key-%d" % i,
                "value": None if i % 5 == 0 else b"value-%d" % i,
                "headers": [("dup", b"1"), ("h", None), ("dup", b"2")] if i % 3 == 0 else None,
            }
        )
    produce(stack.source_bootstrap_servers, sent)
    props = connector_properties(
        stack, unique, **{"topics.whitelist": topic, "destination.topic.name.suffix": ".mirror"}
    )
    create_connector(store, props, {0: [(topic, p) for p in range(partitions)]})

    runner = TaskThread.start(store, unique)
    copied = consume_all(stack.destination_bootstrap_servers, f"{topic}.mirror", partitions, expected=800)
    assert runner.finish() is TaskExit.STOPPED
    source_id = cluster_id(stack.source_bootstrap_servers)

    source = consume_all(stack.source_bootstrap_servers, topic, partitions, expected=800)
    assert len(copied) == 800
    src_by_p, dst_by_p = _by_partition(source), _by_partition(copied)
    for p in range(partitions):
        # Same partition, same order, same key/value/user headers/timestamp.
        assert [(r.key, r.value, r.headers, r.timestamp) for r in src_by_p[p]] == [
            (r.key, r.value, tuple(provenance.user_headers(r.headers)), r.timestamp) for r in dst_by_p[p]
        ]
        for src, dst in zip(src_by_p[p], dst_by_p[p], strict=True):
            origin = provenance.parse(dst.headers)
            assert origin is not None
            assert (origin.source_topic, origin.source_partition, origin.source_offset) == (topic, p, src.offset)
            assert origin.origin_cluster == source_id
            # The layout the engine writes inline is the one `provenance.copy_headers` describes.
            assert list(dst.headers) == provenance.copy_headers(src.headers, source_id, topic, p, src.offset)
    ends = {(topic, p): src_by_p[p][-1].offset + 1 for p in range(partitions)}
    assert _committed(store, unique) == ends
    assert store.lease_of(unique, 0).state == "STOPPED"

    # One sample per topic and interval, however many partitions moved in it; each partition's lag apart.
    samples = store.metric_samples(unique)
    assert {s["topic"] for s in samples} == {topic} and "partition" not in samples[0]
    assert len({s["interval_end"] for s in samples}) == len(samples)
    sizes = [(len(r["key"]) if r["key"] else 0) + (len(r["value"]) if r["value"] else 0) for r in sent]
    assert (sum(s["records"] for s in samples), sum(s["bytes"] for s in samples)) == (800, sum(sizes))
    for s in samples:
        if s["records"]:
            assert s["latency_count"] == s["records"] == s["latency_histogram"]["+Inf"]
            cumulative = [s["latency_histogram"][bound] for bound in BUCKET_LABELS]
            assert cumulative == sorted(cumulative)
            # Source timestamps are from 2023: the latency is large and lands in Mirus's top (12h+) bucket.
            assert s["latency_min_ms"] > 12 * 3600 * 1000 and s["latency_histogram"]["43200000"] == 0
    assert store.partition_lags(unique) == {(topic, p): 0 for p in range(partitions)}
    lags = next(f for f in StoreCollector(store).collect() if f.name == "mirus_partition_lag_records")
    mine = {s.labels["partition"]: s.value for s in lags.samples if s.labels["connector"] == unique}
    assert mine == {str(p): 0 for p in range(partitions)}


def test_destination_topics_are_written_by_one_producer_per_group_of_topics_each_partition_in_order(
    stack: StackEndpoints, store: Store, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Groups of at most 6 destination partitions: a (4) and c (2) share a producer, b (4) has its own.
    monkeypatch.setattr(deliveries, "PARTITIONS_PER_PRODUCER", 6)
    widths = {f"{unique}-a": 4, f"{unique}-b": 4, f"{unique}-c": 2}
    create_topics(stack.source_bootstrap_servers, widths)
    create_topics(stack.destination_bootstrap_servers, widths)
    sent = [{"topic": t, "partition": i % n, "value": b"%s-%d" % (t.encode(), i)} for t, n in widths.items()
            for i in range(100)]  # fmt: skip
    produce(stack.source_bootstrap_servers, sent)
    props = connector_properties(stack, unique, **{"topics.whitelist": ",".join(widths)})
    create_connector(store, props, {0: [(t, p) for t, n in widths.items() for p in range(n)]})

    runner = TaskThread.start(store, unique)
    copied = {t: consume_all(stack.destination_bootstrap_servers, t, n, expected=100) for t, n in widths.items()}
    grouping = runner.task.clients.deliveries.producers
    assert len(grouping.all) == 2
    assert grouping.topics == {f"{unique}-a": 0, f"{unique}-b": 1, f"{unique}-c": 0}
    assert runner.finish() is TaskExit.STOPPED
    for t, n in widths.items():
        for p in range(n):
            expected = [r["value"] for r in sent if r["topic"] == t and r["partition"] == p]
            assert [r.value for r in copied[t] if r.partition == p] == expected
    assert _committed(store, unique) == {(t, p): 100 // n for t, n in widths.items() for p in range(n)}


def test_provenance_headers_can_be_turned_off_and_cycles_are_never_written_back(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    create_topics(stack.source_bootstrap_servers, {unique: 1})
    create_topics(stack.destination_bootstrap_servers, {unique: 1})
    # The second record was itself replicated from the destination cluster earlier (its origin is the destination's
    # cluster id): a cycle. The aliases are left at their defaults; they play no part.
    target = cluster_id(stack.destination_bootstrap_servers)
    looped = provenance.copy_headers([("h", b"x")], target, unique, 0, 41)
    produce(
        stack.source_bootstrap_servers,
        [
            {"topic": unique, "value": b"local", "headers": [("h", b"1")]},
            {"topic": unique, "value": b"came-from-target", "headers": looped},
            {"topic": unique, "value": b"local-2"},
        ],
    )
    props = connector_properties(stack, unique, **{"topics.whitelist": unique, "provenance.headers.enabled": "false"})
    create_connector(store, props, {0: [(unique, 0)]})

    runner = TaskThread.start(store, unique)
    wait_until(lambda: _committed(store, unique).get((unique, 0)) == 3, what="all three offsets committed")
    runner.finish()

    copied = consume_all(stack.destination_bootstrap_servers, unique, 1, expected=2)
    assert [(r.value, r.headers) for r in copied] == [(b"local", (("h", b"1"),)), (b"local-2", ())]


@pytest.mark.parametrize("compact", [False, True], ids=["both-headers", "compact"])
def test_a_copy_of_a_copy_keeps_its_first_cluster_and_copies_in_either_header_layout_never_loop(
    stack: StackEndpoints, store: Store, unique: str, compact: bool
) -> None:
    create_topics(stack.source_bootstrap_servers, {unique: 1})
    create_topics(stack.destination_bootstrap_servers, {unique: 1})
    source, target = cluster_id(stack.source_bootstrap_servers), cluster_id(stack.destination_bootstrap_servers)
    third = "third-cluster-id"
    hopped = provenance.copy_headers([("h", b"1")], third, "t", 2, 5, compact=True)
    legacy = [(provenance.ORIGIN, target.encode()), (provenance.SOURCE, f"{third}/{unique}/0/7".encode())]
    produce(
        stack.source_bootstrap_servers,
        [
            {"topic": unique, "value": b"own"},
            # Copied here from a third cluster, where it was first produced (compact: `mirus.source` alone).
            {"topic": unique, "value": b"from-third", "headers": hopped},
            # Both headers (the default layout), first produced on the destination cluster.
            {"topic": unique, "value": b"loop", "headers": legacy},
            # First produced on the destination cluster and copied here in the compact layout.
            {"topic": unique, "value": b"compact-loop", "headers": provenance.copy_headers(None, target, unique, 0, 3)},
        ],
    )
    props = {"topics.whitelist": unique, "provenance.headers.compact": str(compact).lower()}
    create_connector(store, connector_properties(stack, unique, **props), {0: [(unique, 0)]})
    runner = TaskThread.start(store, unique)
    wait_until(lambda: _committed(store, unique).get((unique, 0)) == 4, what="all four offsets committed")
    runner.finish()

    copied = consume_all(stack.destination_bootstrap_servers, unique, 1, expected=2)
    assert [r.value for r in copied] == [b"own", b"from-third"]
    # The next hop names the first cluster, since it is not its source; a first hop does so unless compact.
    own_origin = () if compact else ((provenance.ORIGIN, source.encode()),)
    assert [r.headers for r in copied] == [
        (*own_origin, (provenance.SOURCE, f"{source}/{unique}/0/0".encode())),
        (("h", b"1"), (provenance.ORIGIN, third.encode()), (provenance.SOURCE, f"{source}/{unique}/0/1".encode())),
    ]
    parsed = [provenance.parse(r.headers) for r in copied]
    assert [(p.origin_cluster, p.source_cluster) for p in parsed if p] == [(source, source), (third, source)]


def test_clean_stop_resumes_from_exactly_the_committed_offsets(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    create_topics(stack.source_bootstrap_servers, {unique: 4})
    create_topics(stack.destination_bootstrap_servers, {unique: 4})
    produce(
        stack.source_bootstrap_servers, [{"topic": unique, "partition": i % 4, "value": b"a%d" % i} for i in range(200)]
    )
    create_connector(
        store, connector_properties(stack, unique, **{"topics.whitelist": unique}), {0: [(unique, p) for p in range(4)]}
    )

    first = TaskThread.start(store, unique)
    consume_all(stack.destination_bootstrap_servers, unique, 4, expected=200)
    first.finish()
    assert sum(_committed(store, unique).values()) == 200

    produce(
        stack.source_bootstrap_servers, [{"topic": unique, "partition": i % 4, "value": b"b%d" % i} for i in range(100)]
    )
    second = TaskThread.start(store, unique)
    copied = consume_all(stack.destination_bootstrap_servers, unique, 4, expected=300)
    second.finish()

    values = [r.value for r in copied]
    assert len(values) == len(set(values)) == 300  # nothing lost, nothing replayed
    assert sum(_committed(store, unique).values()) == 300


def _one_partition_task(
    stack: StackEndpoints, store: Store, unique: str, flush: str, heartbeat: str, **properties: str
) -> TaskThread:
    """A task copying topic `unique`'s one partition, committing every `flush` ms, heartbeating every `heartbeat` ms."""
    create_topics(stack.source_bootstrap_servers, {unique: 1})
    create_topics(stack.destination_bootstrap_servers, {unique: 1})
    settings = {"offset.flush.interval.ms": flush, "task.heartbeat.interval.ms": heartbeat, **properties}
    create_connector(store, connector_properties(stack, unique, **{"topics.whitelist": unique, **settings}),
                     {0: [(unique, 0)]})  # fmt: skip
    return TaskThread.start(store, unique)


def test_the_lease_heartbeats_every_heartbeat_interval_between_commits_further_apart(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    # Commits every 60 s would leave the lease silent past task.lease.timeout.ms: a standby would fence a live task.
    lease_timeout = {"task.lease.timeout.ms": "1000"}
    task = _one_partition_task(stack, store, unique, flush="60000", heartbeat="200", **lease_timeout)
    try:
        wait_until(lambda: store.lease_of(unique, 0) is not None, timeout=60, what="the task claiming its lease")
        seen = set()
        wait_until(
            lambda: seen.add(store.lease_of(unique, 0).heartbeat_at) or len(seen) >= 5,
            timeout=10,
            what="five heartbeats within ten seconds",
        )
        produce(stack.source_bootstrap_servers, [{"topic": unique, "partition": 0, "value": b"v"}])
        consume_all(stack.destination_bootstrap_servers, unique, 1, expected=1)
        assert sum(_committed(store, unique).values()) == 0, "heartbeats store no offsets: the next commit is 60 s away"
        assert task.thread is not None and task.thread.is_alive()
    finally:
        task.finish()
    assert sum(_committed(store, unique).values()) == 1  # the final commit


def test_an_idle_task_writes_its_heartbeat_alone_not_a_commit_every_flush_interval(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    # Every commit is a Postgres transaction that heartbeats the lease: an idle task committing nothing every
    # offset.flush.interval.ms would cost Postgres that many transactions for each of thousands of idle tasks.
    task = _one_partition_task(stack, store, unique, flush="1000", heartbeat="3000")
    try:
        produce(stack.source_bootstrap_servers, [{"topic": unique, "partition": 0, "value": b"v"}])
        wait_until(lambda: sum(_committed(store, unique).values()) == 1, timeout=60, what="the first record committed")
        heartbeats, window_ends = set(), time.monotonic() + 6.5
        while time.monotonic() < window_ends:  # sampled: the lease's heartbeat_at over 6.5 idle seconds
            heartbeats.add(store.lease_of(unique, 0).heartbeat_at)
            time.sleep(0.05)
        assert 2 <= len(heartbeats) <= 4, f"{len(heartbeats)} writes in 6.5 s: one every 3 s, not one a second"
        produce(stack.source_bootstrap_servers, [{"topic": unique, "partition": 0, "value": b"w"}])
        wait_until(lambda: sum(_committed(store, unique).values()) == 2, timeout=10, what="a record moving commits")
    finally:
        task.finish()


def test_quiet_partitions_move_to_cheap_fetches_and_flow_again_at_their_next_record(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    create_topics(stack.source_bootstrap_servers, {unique: 3})
    create_topics(stack.destination_bootstrap_servers, {unique: 3})
    create_connector(
        store, connector_properties(stack, unique, **{"topics.whitelist": unique}), {0: [(unique, p) for p in range(3)]}
    )
    produce(stack.source_bootstrap_servers, [{"topic": unique, "partition": p, "value": b"a%d" % p} for p in (0, 1)])
    # Consumers of at most two partitions: every tier spreads the three over two.
    limits = TierLimits(quiet_after_s=0.5, dormant_after_s=1.0, shard_partitions=2, eager_start_partitions=0)
    runner = TaskThread.start(store, unique, reader_limits=limits)
    wait_until(lambda: any(e.startswith("replicating") for e in runner.events), what="the task replicating")
    reader = runner.task.clients.reader
    # A task starts more than `eager_start_partitions` (here 0) in the quiet tier (answered at a record's first
    # byte): a start or a takeover of thousands of partitions does not begin with thousands of eager fetches.
    assert [s.assigned for s in reader.quiet.shards] == [2, 1]
    assert reader.assigned_in(reader.flowing) == 0
    consume_all(stack.destination_bootstrap_servers, unique, 3, expected=2)
    # Partitions 0 and 1 were read and stopped; partition 2 never had a record (its empty log's end is its place).
    # Each goes quiet, then dormant (a fetch every 10 s when idle).
    wait_until(lambda: reader.assigned_in(reader.dormant) == 3, timeout=30, what="every partition in the dormant tier")
    assert [s.assigned for s in reader.dormant.shards] == [2, 1]
    # Its producer, idle as long as a partition takes to turn dormant, is closed (an idle client's threads still
    # wake); the next record opens it again.
    producers = runner.task.clients.deliveries.producers
    wait_until(lambda: producers.all == [None], timeout=30, what="the idle producer closed")
    # Records on dormant partitions flow at once, and their partitions go back to eager fetching from the next offset.
    produce(stack.source_bootstrap_servers, [{"topic": unique, "partition": 0, "value": b"b%d" % i} for i in range(50)])
    produce(stack.source_bootstrap_servers, [{"topic": unique, "partition": 2, "value": b"c%d" % i} for i in range(5)])
    consume_all(stack.destination_bootstrap_servers, unique, 3, expected=57)
    produce(stack.source_bootstrap_servers, [{"topic": unique, "partition": 0, "value": b"d%d" % i} for i in range(50)])
    copied = consume_all(stack.destination_bootstrap_servers, unique, 3, expected=107)
    wait_until(
        lambda: reader.assigned_in(reader.quiet) + reader.assigned_in(reader.dormant) == 3,
        timeout=30,
        what="every partition quiet again",
    )
    # A quiet partition's record flows too (before it turns dormant), read where it is: one record is no traffic.
    produce(stack.source_bootstrap_servers, [{"topic": unique, "partition": 1, "value": b"e"}])
    copied = consume_all(stack.destination_bootstrap_servers, unique, 3, expected=108)
    runner.finish()
    by_partition = _by_partition(copied)
    later = [*(b"b%d" % i for i in range(50)), *(b"d%d" % i for i in range(50))]
    assert [r.value for r in by_partition[0]] == [b"a0", *later]
    assert [r.value for r in by_partition[1]] == [b"a1", b"e"]
    assert [r.value for r in by_partition[2]] == [b"c%d" % i for i in range(5)]
    assert _committed(store, unique) == {(unique, 0): 101, (unique, 1): 2, (unique, 2): 5}


def test_only_partitions_that_keep_flowing_move_to_eager_fetching(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    create_topics(stack.source_bootstrap_servers, {unique: 2})
    create_topics(stack.destination_bootstrap_servers, {unique: 2})
    create_connector(
        store, connector_properties(stack, unique, **{"topics.whitelist": unique}), {0: [(unique, 0), (unique, 1)]}
    )
    runner = TaskThread.start(store, unique, reader_limits=TierLimits(quiet_after_s=3.0, eager_start_partitions=0))
    wait_until(lambda: any(e.startswith("replicating") for e in runner.events), what="the task replicating")
    reader = runner.task.clients.reader
    # One record is read where it is (quiet: answered at its first byte) ...
    produce(stack.source_bootstrap_servers, [{"topic": unique, "partition": 1, "value": b"one"}])
    consume_all(stack.destination_bootstrap_servers, unique, 2, expected=1)
    # ... while a partition whose records keep coming (here every ~50 ms) moves to eager fetching.
    trickle = iter(range(10_000))
    producer = Producer({"bootstrap.servers": stack.source_bootstrap_servers, "enable.idempotence": True})

    def flowing_after_one_more() -> bool:
        producer.produce(unique, b"t%d" % next(trickle), partition=0)
        producer.flush(10)
        return reader.shard[(unique, 0)].tier is reader.flowing

    wait_until(flowing_after_one_more, timeout=30, interval=0.05, what="the partition with steady traffic flowing")
    assert reader.shard[(unique, 1)].tier is reader.quiet
    sent = next(trickle)
    copied = consume_all(stack.destination_bootstrap_servers, unique, 2, expected=1 + sent)
    runner.finish()
    by_partition = _by_partition(copied)
    assert [r.value for r in by_partition[0]] == [b"t%d" % i for i in range(sent)]  # in order across the move
    assert _committed(store, unique) == {(unique, 0): sent, (unique, 1): 1}


def test_a_few_partitions_started_beside_many_quiet_ones_are_fetched_eagerly_until_they_go_quiet(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    # The quiet consumer's fetch in flight holds every other request on its connection for up to 500 ms: a new
    # topic's partitions placed there would wait that long for their metadata and their first fetch.
    held, new = f"{unique}-held", f"{unique}-new"
    create_topics(stack.source_bootstrap_servers, {held: 3, new: 1})
    create_topics(stack.destination_bootstrap_servers, {held: 3, new: 1})
    create_connector(
        store,
        connector_properties(stack, unique, **{"topics.regex": f"{unique}-.*"}),
        {0: [(held, p) for p in range(3)]},
    )
    limits = TierLimits(quiet_after_s=1.0, eager_start_partitions=2)
    runner = TaskThread.start(store, unique, reader_limits=limits)
    wait_until(lambda: any(e.startswith("replicating 3") for e in runner.events), what="the task replicating")
    reader = runner.task.clients.reader
    assert reader.assigned_in(reader.quiet) == 3  # more than eager_start_partitions: quiet from the start
    produce(stack.source_bootstrap_servers, [{"topic": new, "value": b"first"}])
    store.write_assignment(unique, {0: [*((held, p) for p in range(3)), (new, 0)]})
    wait_until(lambda: (new, 0) in reader.shard, what="the new partition started")
    assert reader.shard[(new, 0)].tier is reader.flowing
    assert [r.value for r in consume_all(stack.destination_bootstrap_servers, new, 1, expected=1)] == [b"first"]
    # Silent after its record, it joins the others.
    wait_until(lambda: reader.assigned_in(reader.quiet) == 4, timeout=30, what="the new partition quiet")
    runner.finish()
    assert _committed(store, unique)[(new, 0)] == 1


def test_kill_9_mid_stream_loses_nothing(stack: StackEndpoints, store: Store, unique: str, tmp_path: Path) -> None:
    partitions, total = 4, 40_000
    create_topics(stack.source_bootstrap_servers, {unique: partitions})
    create_topics(stack.destination_bootstrap_servers, {unique: partitions})
    create_connector(
        store,
        connector_properties(stack, unique, **{"topics.whitelist": unique}),
        {0: [(unique, p) for p in range(partitions)]},
    )
    # The source keeps growing while the task runs, so the kill lands mid-stream with records in flight.
    traffic = Traffic(stack.source_bootstrap_servers, {unique: partitions}, rate=10_000, total=total)
    env = {**os.environ, "MIRUS_DATABASE_URL": stack.database_url}
    argv = [sys.executable, "-c", "from mirus.cli.main import main; main()", "task", "run", unique, "0"]

    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_until(
            lambda: sum(_committed(store, unique).values()) > 0, timeout=60, interval=0.02, what="a first commit"
        )
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    committed_at_kill = _committed(store, unique)
    assert traffic.running or sum(committed_at_kill.values()) < total, "the kill did not land mid-stream"
    assert traffic.join() == total

    with open(tmp_path / "second.log", "w") as log:
        second = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(
                lambda: sum(_committed(store, unique).values()) == total, timeout=120, what="everything committed"
            )
        finally:
            second.send_signal(signal.SIGINT)
            second.wait(30)

    replica = check_replica(
        stack.source_bootstrap_servers,
        unique,
        stack.destination_bootstrap_servers,
        partitions=partitions,
        written=total,
    )
    replica.assert_at_least_once()
    # At-least-once: duplicates are only records after the last committed offset before the kill.
    replica.assert_duplicates_only_after({p: o for (_, p), o in committed_at_kill.items()})


def test_a_second_instance_fences_the_first(stack: StackEndpoints, store: Store, unique: str) -> None:
    create_topics(stack.source_bootstrap_servers, {unique: 2})
    create_topics(stack.destination_bootstrap_servers, {unique: 2})
    create_connector(
        store, connector_properties(stack, unique, **{"topics.whitelist": unique}), {0: [(unique, 0), (unique, 1)]}
    )
    produce(
        stack.source_bootstrap_servers, [{"topic": unique, "partition": i % 2, "value": b"%d" % i} for i in range(100)]
    )

    first = TaskThread.start(store, unique, owner="first")
    wait_until(lambda: sum(_committed(store, unique).values()) == 100, what="first instance replicating")
    second = TaskThread.start(store, unique, owner="second")

    assert first.join() is TaskExit.FENCED
    produce(
        stack.source_bootstrap_servers, [{"topic": unique, "partition": i % 2, "value": b"n%d" % i} for i in range(50)]
    )
    wait_until(lambda: sum(_committed(store, unique).values()) == 150, what="second instance replicating")
    lease = store.lease_of(unique, 0)
    assert lease is not None and (lease.owner, lease.epoch) == ("second", 2)
    with store.engine.connect() as conn:
        epochs = set(conn.execute(text("SELECT epoch FROM offsets WHERE connector = :c"), {"c": unique}).scalars())
    assert epochs == {2}
    assert second.finish() is TaskExit.STOPPED


def test_assignment_changes_apply_live(stack: StackEndpoints, store: Store, unique: str) -> None:
    a, b = f"{unique}-a", f"{unique}-b"
    create_topics(stack.source_bootstrap_servers, {a: 2, b: 1})
    create_topics(stack.destination_bootstrap_servers, {a: 2, b: 1})
    produce(
        stack.source_bootstrap_servers,
        [{"topic": t, "partition": p, "value": b"x"} for t, p in [(a, 0), (a, 1), (b, 0)]],
    )
    create_connector(store, connector_properties(stack, unique, **{"topics.regex": f"{unique}-.*"}), {0: [(a, 0)]})

    runner = TaskThread.start(store, unique)
    wait_until(lambda: _committed(store, unique) == {(a, 0): 1}, what="first partition")
    store.write_assignment(unique, {0: [(a, 0), (a, 1), (b, 0)]})
    wait_until(lambda: _committed(store, unique) == {(a, 0): 1, (a, 1): 1, (b, 0): 1}, what="added partitions")

    store.write_assignment(unique, {0: [(b, 0)], 1: [(a, 0), (a, 1)]})
    wait_until(
        lambda: all(s.task_id is None for tp, s in store.partition_statuses(unique).items() if tp[0] == a),
        what="partitions of topic a released",
    )
    produce(stack.source_bootstrap_servers, [{"topic": b, "value": b"y"}, {"topic": a, "partition": 0, "value": b"z"}])
    wait_until(lambda: _committed(store, unique)[(b, 0)] == 2, what="remaining partition keeps flowing")
    assert _committed(store, unique)[(a, 0)] == 1  # released: no longer replicated by this task
    assert runner.thread.is_alive() and not any("claimed" in e for e in runner.events[1:])  # never restarted

    # Task 0 is no longer part of the connector: it commits, releases everything and ends.
    store.write_assignment(unique, {1: [(a, 0), (a, 1), (b, 0)]})
    assert runner.join() is TaskExit.REMOVED
    assert store.partition_statuses(unique)[(b, 0)].task_id is None
    assert _committed(store, unique)[(b, 0)] == 2


def test_a_deleted_destination_topic_pauses_only_its_partition(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    good, poisoned = f"{unique}-good", f"{unique}-bad"
    create_topics(stack.source_bootstrap_servers, {good: 1, poisoned: 1})
    create_topics(stack.destination_bootstrap_servers, {good: 1, poisoned: 1})
    create_connector(
        store,
        connector_properties(stack, unique, **{"topics.whitelist": f"{good},{poisoned}"}),
        {0: [(good, 0), (poisoned, 0)]},
    )
    produce(stack.source_bootstrap_servers, [{"topic": t, "value": b"1"} for t in (good, poisoned)])
    runner = TaskThread.start(store, unique)
    wait_until(lambda: _committed(store, unique) == {(good, 0): 1, (poisoned, 0): 1}, what="both replicating")

    delete_topics(stack.destination_bootstrap_servers, [poisoned])

    def paused() -> dict | None:
        status = store.partition_statuses(unique)[(poisoned, 0)]
        return status if status.state == "PAUSED" else None

    # The task notices the missing destination itself. (Records written into the deletion window are refused by
    # Apache Kafka and pause the partition the same way; the test broker acknowledges them instead, so none are.)
    status = wait_until(paused, what="poisoned partition paused")
    assert poisoned in status.reason and "does not exist" in status.reason
    produce(stack.source_bootstrap_servers, [{"topic": t, "value": b"2"} for t in (good, poisoned)])
    produce(stack.source_bootstrap_servers, [{"topic": good, "value": b"3"}])
    wait_until(lambda: _committed(store, unique)[(good, 0)] == 3, what="the healthy partition keeps flowing")
    assert _committed(store, unique)[(poisoned, 0)] == 1

    create_topics(stack.destination_bootstrap_servers, {poisoned: 1})
    wait_until(lambda: _committed(store, unique)[(poisoned, 0)] == 2, timeout=60, what="paused partition resumes")
    assert store.partition_statuses(unique)[(poisoned, 0)].state == "ACTIVE"
    runner.finish()
    assert [r.value for r in consume_all(stack.destination_bootstrap_servers, poisoned, 1, expected=1)] == [b"2"]


def test_the_commit_watchdog_fails_the_task_when_commits_stop(stack: StackEndpoints, unique: str) -> None:
    # A private database whose offsets table disappears mid-run: commits fail for real while records flow.
    engine = private_database(stack, unique)
    store = Store(engine)
    create_topics(stack.source_bootstrap_servers, {unique: 1})
    create_topics(stack.destination_bootstrap_servers, {unique: 1})
    props = connector_properties(stack, unique, **{"topics.whitelist": unique, "commit.failure.restart.ms": "1500"})
    create_connector(store, props, {0: [(unique, 0)]})
    runner = TaskThread.start(store, unique)
    produce(stack.source_bootstrap_servers, [{"topic": unique, "value": b"1"}])
    wait_until(lambda: _committed(store, unique) == {(unique, 0): 1}, what="first commit")

    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE offsets RENAME TO offsets_gone"))
    produce(stack.source_bootstrap_servers, [{"topic": unique, "value": b"%d" % i} for i in range(10)])

    with pytest.raises(CommitWatchdogError, match=r"commit.failure.restart.ms"):
        runner.join(timeout=30)
    engine.dispose()


def test_a_new_config_version_and_a_restart_apply_in_place(stack: StackEndpoints, store: Store, unique: str) -> None:
    create_topics(stack.source_bootstrap_servers, {unique: 2})
    create_topics(stack.destination_bootstrap_servers, {unique: 2, f"{unique}.v2": 2})
    props = connector_properties(stack, unique, **{"topics.whitelist": unique})
    create_connector(store, props, {0: [(unique, 0), (unique, 1)]})
    produce(
        stack.source_bootstrap_servers, [{"topic": unique, "partition": i % 2, "value": b"a%d" % i} for i in range(20)]
    )
    runner = TaskThread.start(store, unique)
    wait_until(lambda: sum(_committed(store, unique).values()) == 20, what="first version replicating")

    # Version 2 renames the destination: the same run continues from the committed offsets into the new topic.
    store.put_connector(unique, {**props, "destination.topic.name.suffix": ".v2"}, 1)
    wait_until(lambda: any("configuration version 2" in e for e in runner.events), what="clients rebuilt in place")
    produce(
        stack.source_bootstrap_servers, [{"topic": unique, "partition": i % 2, "value": b"b%d" % i} for i in range(10)]
    )
    renamed = consume_all(stack.destination_bootstrap_servers, f"{unique}.v2", 2, expected=10)
    assert sorted(r.value for r in renamed) == sorted(b"b%d" % i for i in range(10))  # no replay of version 1

    store.request_restart(unique)
    wait_until(lambda: sum("restarting clients in place" in e for e in runner.events) == 2, what="restart in place")
    produce(stack.source_bootstrap_servers, [{"topic": unique, "value": b"c"}])
    wait_until(lambda: sum(_committed(store, unique).values()) == 31, what="replicating after the restart")
    assert runner.thread.is_alive() and sum("claimed" in e for e in runner.events) == 1
    assert runner.finish() is TaskExit.STOPPED


def test_clients_made_again_while_the_destination_hangs_keep_the_cluster_ids_and_replicate_on(
    stack: StackEndpoints, store: Store, destination_broker: BrokerProcess, unique: str
) -> None:
    # Seen with overloaded brokers: a task that made its clients again (new size limits) read both clusters' ids again,
    # and one metadata time-out ended it (ClusterIdentityError). Clients made again for the same clusters keep the ids
    # they have when the clusters do not answer.
    endpoints = StackEndpoints(stack.source_bootstrap_servers, destination_broker.bootstrap, stack.database_url)
    create_topics(endpoints.source_bootstrap_servers, {unique: 2})
    create_topics(endpoints.destination_bootstrap_servers, {unique: 2})
    create_connector(
        store, connector_properties(endpoints, unique, **{"topics.whitelist": unique}), {0: [(unique, 0), (unique, 1)]}
    )
    produce(
        endpoints.source_bootstrap_servers,
        [{"topic": unique, "partition": i % 2, "value": b"a%d" % i} for i in range(20)],
    )
    runner = TaskThread.start(store, unique)
    assert destination_broker.proc is not None
    try:
        wait_until(lambda: sum(_committed(store, unique).values()) == 20, what="replicating")
        destination_broker.proc.send_signal(signal.SIGSTOP)  # connections stay open; nothing is answered
        store.request_restart(unique)
        started = lambda: sum(e.startswith("replicating") for e in runner.events) == 2  # noqa: E731
        wait_until(lambda: started() or not runner.thread.is_alive(), timeout=90, what="the clients made again")
        assert runner.thread.is_alive(), f"the task ended: {runner.error!r}"
        assert any("the ids read before for the same clusters are kept" in e for e in runner.events)
    finally:
        destination_broker.proc.send_signal(signal.SIGCONT)
    produce(
        endpoints.source_bootstrap_servers,
        [{"topic": unique, "partition": i % 2, "value": b"b%d" % i} for i in range(10)],
    )
    wait_until(lambda: sum(_committed(store, unique).values()) == 30, timeout=90, what="replicating after the hang")
    copied = consume_all(endpoints.destination_bootstrap_servers, unique, 2, expected=30)
    assert sorted(r.value for r in copied) == sorted([b"a%d" % i for i in range(20)] + [b"b%d" % i for i in range(10)])
    assert runner.finish() is TaskExit.STOPPED


def test_a_restart_after_the_destination_cluster_was_replaced_at_its_address_guards_cycles_with_the_new_id(
    stack: StackEndpoints, store: Store, destination_broker: BrokerProcess, unique: str, tmp_path: Path
) -> None:
    endpoints = StackEndpoints(stack.source_bootstrap_servers, destination_broker.bootstrap, stack.database_url)
    create_topics(endpoints.source_bootstrap_servers, {unique: 1})
    create_topics(endpoints.destination_bootstrap_servers, {unique: 1})
    create_connector(store, connector_properties(endpoints, unique, **{"topics.whitelist": unique}), {0: [(unique, 0)]})
    produce(endpoints.source_bootstrap_servers, [{"topic": unique, "value": b"a"}])
    runner = TaskThread.start(store, unique)
    wait_until(lambda: sum(_committed(store, unique).values()) == 1, what="replicating")
    # Another cluster, with another id, at the same address: what was read of the old one must not stand.
    destination_broker.stop(signal.SIGKILL)
    port = destination_broker.listen_port
    replaced = tansu_broker("destination-replaced", port, port, tmp_path / "replaced.log")
    replaced.start()
    try:
        create_topics(endpoints.destination_bootstrap_servers, {unique: 1})
        store.request_restart(unique)
        wait_until(lambda: sum(e.startswith("replicating") for e in runner.events) == 2, what="clients made again")
        looped = (provenance.ORIGIN, cluster_id(endpoints.destination_bootstrap_servers).encode())
        produce(
            endpoints.source_bootstrap_servers,
            [{"topic": unique, "value": b"looped", "headers": [looped]}, {"topic": unique, "value": b"b"}],
        )
        wait_until(lambda: sum(_committed(store, unique).values()) == 3, what="both records handled")
        # The record that came from the new destination cluster is never written back to it.
        copied = consume_all(endpoints.destination_bootstrap_servers, unique, 1, expected=1)
        assert [r.value for r in copied] == [b"b"]
        assert runner.finish() is TaskExit.STOPPED
    finally:
        replaced.stop(signal.SIGKILL)


@pytest.mark.parametrize("skipping", [False, True], ids=["re-sent-and-counted", "resumed-after-the-copies"])
def test_a_kill_re_sends_what_was_copied_after_the_last_commit_counted_or_resumes_after_it(
    stack: StackEndpoints, store: Store, unique: str, tmp_path: Path, skipping: bool
) -> None:
    partitions = 2
    create_topics(stack.source_bootstrap_servers, {unique: partitions})
    create_topics(stack.destination_bootstrap_servers, {unique: partitions})
    # Commits an hour apart: the killed run copies everything and commits (almost) nothing of it.
    extra = {"topics.whitelist": unique, "offset.flush.interval.ms": 3_600_000}
    create_connector(
        store,
        connector_properties(stack, unique, **extra, **{"start.after.destination.copies": skipping}),
        {0: [(unique, p) for p in range(partitions)]},
    )
    produce(
        stack.source_bootstrap_servers,
        [{"topic": unique, "partition": i % partitions, "value": b"a%d" % i} for i in range(200)],
    )
    first = TaskThread.start(store, unique)
    consume_all(stack.destination_bootstrap_servers, unique, partitions, expected=200)
    first.finish()  # the final commit stores where the next copy of each partition goes at the destination

    produce(
        stack.source_bootstrap_servers,
        [{"topic": unique, "partition": i % partitions, "value": b"b%d" % i} for i in range(300)],
    )
    env = {**os.environ, "MIRUS_DATABASE_URL": stack.database_url}
    argv = [sys.executable, "-c", "from mirus.cli.main import main; main()", "task", "run", unique, "0"]
    with open(tmp_path / "killed.log", "w") as log:
        killed = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            consume_all(stack.destination_bootstrap_servers, unique, partitions, expected=500)
        finally:
            killed.send_signal(signal.SIGKILL)
            killed.wait(10)
    committed_at_kill = _committed(store, unique)
    assert sum(committed_at_kill.values()) < 500, "the killed run committed everything: nothing to re-send"

    last = TaskThread.start(store, unique)
    wait_until(lambda: any("replicating" in e for e in last.events), timeout=60, what="the partitions started")
    if skipping:  # the offsets after the copies are stored at once, before anything new moves
        assert sum(_committed(store, unique).values()) == 500
    produce(
        stack.source_bootstrap_servers,
        [{"topic": unique, "partition": i % partitions, "value": b"c%d" % i} for i in range(20)],
    )
    consume_all(stack.destination_bootstrap_servers, unique, partitions, expected=520, distinct=lambda r: r.value)
    last.finish()

    replica = check_replica(
        stack.source_bootstrap_servers,
        unique,
        stack.destination_bootstrap_servers,
        partitions=partitions,
        written=520,
    )
    replica.assert_at_least_once()
    resent = next(f for f in StoreCollector(store).collect() if f.name == "mirus_records_resent")
    counted = sum(s.value for s in resent.samples if s.labels["connector"] == unique and s.name.endswith("_total"))
    if skipping:
        replica.assert_exactly_once()
        assert counted == 0
        assert any("resuming after" in e and "copied since the last commit" in e for e in last.events), last.events
    else:
        duplicated = sum(replica.duplicated.values())
        assert duplicated == 500 - sum(committed_at_kill.values())  # everything the killed run had not committed
        assert counted == duplicated  # the metric counts each record written again
        assert any(f"re-sending {duplicated} record(s) copied" in e for e in last.events), last.events


def test_a_task_that_hears_notices_reads_its_connector_every_ten_seconds_and_still_reacts_at_once(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    # Twice a second was most of an idle task's Postgres transactions; proven notices make the read a safety net.
    create_topics(stack.source_bootstrap_servers, {unique: 1})
    create_topics(stack.destination_bootstrap_servers, {unique: 1})
    create_connector(store, connector_properties(stack, unique, **{"topics.whitelist": unique}), {0: [(unique, 0)]})
    notices = HeadNotices(store.engine)
    try:
        wait_until(notices.heard, what="notices proven to arrive")
        runner = TaskThread.start(store, unique, notices=notices)
        wait_until(lambda: REFRESHING in runner.task.scheduler.next_at, what="the task's first read of its row")
        next_read = runner.task.scheduler.next_at[REFRESHING] - time.monotonic()
        assert follower.REFRESH_INTERVAL_S < next_read <= follower.HEARD_REFRESH_INTERVAL_S, next_read
        store.set_connector_state(unique, ConnectorState.PAUSED)
        assert runner.join(5) is TaskExit.PAUSED  # told by the notice, long before the next read
    finally:
        notices.close()


def test_a_change_to_the_connector_reaches_the_task_when_postgres_says_so_not_at_its_next_read(
    stack: StackEndpoints, store: Store, unique: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The periodic read made as good as absent: only the notice (migration 0012's trigger, LISTEN) can tell the task.
    monkeypatch.setattr(follower, "REFRESH_INTERVAL_S", 3600.0)
    caplog.set_level(logging.DEBUG, logger="replicator")
    first, added = f"{unique}-a", f"{unique}-b"
    create_topics(stack.source_bootstrap_servers, {first: 1, added: 1})
    create_topics(stack.destination_bootstrap_servers, {first: 1, added: 1})
    create_connector(store, connector_properties(stack, unique, **{"topics.regex": f"{unique}-.*"}), {0: [(first, 0)]})
    notices = HeadNotices(store.engine)
    try:
        wait_until(notices.listening.is_set, what="the notices connection listening")
        runner = TaskThread.start(store, unique, notices=notices)
        wait_until(lambda: any(e.startswith("replicating 1") for e in runner.events), what="the task replicating")
        produce(stack.source_bootstrap_servers, [{"topic": added, "value": b"new"}])
        store.write_assignment(unique, {0: [(first, 0), (added, 0)]})
        assert [r.value for r in consume_all(stack.destination_bootstrap_servers, added, 1, expected=1)] == [b"new"]
        # The stages benchmarks/orchestration_latency.py times, logged at DEBUG in the order they happened.
        lines = [record.getMessage() for record in caplog.records]
        stages = [f"notified: {unique}", f"flowing consumer assigned 1 partition(s) of: {added}"]
        stages.append(f"first records fetched of: {added}")
        at = [lines.index(stage) for stage in stages]
        assert at == sorted(at), lines
        store.set_connector_state(unique, ConnectorState.PAUSED)
        assert runner.join(30) is TaskExit.PAUSED
    finally:
        notices.close()
