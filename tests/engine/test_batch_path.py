"""The batch path in a running task (`copy.mode=batches`, `replicator.engine.batch_lanes`), on Apache Kafka 1.0: a
partition's batches are copied as bytes (compressed ones still compressed at the destination, no provenance headers
added), a batch that cannot pass is copied by the record path in its place, in order, and the partition returns to
the batch path after it; offsets are committed as on the record path, so a restart resumes where the copy stopped.
Each hand-back is counted by reason where an operator looks: `/metrics` (scraped over HTTP) and the connectors asset."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import dagster as dg
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from assets.connectors import connectors_materialization
from mirus.api.auth import ApiSettings
from mirus.api.metrics import StoreCollector
from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.batches.record_batch import RecordBatch, split
from replicator.batches.wire import KafkaWire, Partition
from replicator.configuration.connector import validate_submission
from replicator.configuration.model import ConnectorConfigError
from replicator.engine.metrics import HAND_BACK_REASONS
from replicator.engine.task import TaskExit
from replicator.state.store import Store
from replicator.topics import provenance
from tests.fixtures.api_helpers import serve_api
from tests.fixtures.batch_helpers import compacted_with_gaps
from tests.fixtures.engine_helpers import TaskThread, connector_properties, create_connector
from tests.fixtures.kafka_helpers import Rec, cluster_id, consume_all, create_topics, produce

BATCHES = {"copy.mode": "batches"}


@pytest.fixture(scope="module")
def api(apache_kafka: StackEndpoints, db_engine: Engine) -> Iterator[str]:
    with serve_api(Store(db_engine), ApiSettings(), apache_kafka.destination_bootstrap_servers) as url:
        yield url


@pytest.fixture
def destination_wire(apache_kafka: StackEndpoints) -> Iterator[KafkaWire]:
    with KafkaWire({"bootstrap.servers": apache_kafka.destination_bootstrap_servers}, fetch_max_bytes=8_000_000) as w:
        yield w


def _raw_batches(wire: KafkaWire, topic: str, partition: int) -> list[RecordBatch]:
    fetched = wire.fetch({Partition(topic, partition): 0}, partition_max_bytes=4_000_000)
    result = fetched[Partition(topic, partition)]
    assert result.problem is None, result.problem
    return split(result.records)[0]


def _as_read(records: list[Rec], strip_provenance: bool = False) -> list[tuple[object, ...]]:
    """Records as a reader sees them, per partition in order (offsets aside: the copies' are the destination's)."""
    rows = []
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        headers = provenance.user_headers(r.headers or []) if strip_provenance else r.headers
        rows.append((r.partition, r.key, r.value, list(headers or []), r.timestamp))
    return rows


def _scraped(api: str, metric: str, connector: str, label: str) -> dict[str, float]:
    """`metric`'s samples of `connector` by `label`, as Prometheus scrapes them."""
    families = text_string_to_metric_families(requests.get(f"{api}/metrics", timeout=30).text)
    samples = [s for family in families for s in family.samples if s.name == metric]
    return {s.labels[label]: s.value for s in samples if s.labels["connector"] == connector}


def _asset_row(store: Store, instance: dg.DagsterInstance, connector: str) -> dict[str, str]:
    """The connector's row of the connectors asset's copy.mode=batches table, by column."""
    table = str(connectors_materialization(store, "test", instance).metadata["copy.mode=batches"].value)
    lines = table.splitlines()
    header = [cell.strip() for cell in next(line for line in lines if line.startswith("| connector")).split("|")]
    row = [cell.strip() for cell in next(line for line in lines if line.startswith(f"| {connector} |")).split("|")]
    return dict(zip(header[1:-1], row[1:-1], strict=True))


def _source_records(topic: str, partitions: int, count: int, size: int) -> list[dict[str, object]]:
    return [
        {
            "topic": topic,
            "partition": i % partitions,
            "key": b"k%d" % i,
            "value": (b"%06d." % i * (size // 7 + 1))[:size],
            "headers": [("h", b"%d" % i), ("h", b"again")],
            "timestamp": int(time.time() * 1000) - 60_000 + i,  # recent: a retention check must not delete them
        }
        for i in range(count)
    ]


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_batches_are_copied_as_bytes_and_resumed_after_a_stop(
    apache_kafka: StackEndpoints, store: Store, unique: str, destination_wire: KafkaWire, compression: str
) -> None:
    source, destination = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    create_topics(source, {unique: 2})
    create_topics(destination, {unique: 2})
    produce(source, _source_records(unique, 2, 2000, 300), **{"compression.type": compression, "linger.ms": 50})
    create_connector(
        store,
        connector_properties(apache_kafka, unique, **{"topics.whitelist": unique, **BATCHES}),
        {0: [(unique, 0), (unique, 1)]},
    )
    runner = TaskThread.start(store, unique)
    wait_until(lambda: store.load_offsets(unique) == {(unique, 0): 1000, (unique, 1): 1000}, what="2,000 copied")
    assert runner.finish() is TaskExit.STOPPED
    assert any("copied as batches" in e for e in runner.events), runner.events

    copies = consume_all(destination, unique, 2, expected=2000)
    originals = consume_all(source, unique, 2, expected=2000)
    assert _as_read(copies) == _as_read(originals), "keys, values, headers and timestamps, in order, once"
    assert not [c for c in copies if provenance.parse(c.headers) is not None], "batches carry no provenance headers"
    for p in range(2):
        copied = _raw_batches(destination_wire, unique, p)
        assert copied and {b.compression for b in copied} == {3 if compression == "lz4" else 0}, "not recompressed"
        assert all(b.producer_id >= 0 and not b.attributes & 0x10 for b in copied), "idempotent, not transactional"

    # Where the copies went, in Postgres (no header says it): one segment a partition, the copies' producer recorded.
    assert {tp: [(s.source_start, s.destination_start, s.count) for s in segments]
            for tp, segments in store.load_segments(unique).items()} == {
        (unique, 0): [(0, 0, 1000)], (unique, 1): [(0, 0, 1000)]
    }  # fmt: skip
    producers = {b.producer_id for p in range(2) for b in _raw_batches(destination_wire, unique, p)}
    assert producers <= store.platform_producer_ids(cluster_id(destination))

    # A restart resumes after what was committed: nothing re-sent after a clean stop.
    produce(source, _source_records(unique, 2, 200, 300), **{"compression.type": compression})
    runner = TaskThread.start(store, unique)
    wait_until(lambda: store.load_offsets(unique) == {(unique, 0): 1100, (unique, 1): 1100}, what="200 more copied")
    assert runner.finish() is TaskExit.STOPPED
    assert len(consume_all(destination, unique, 2, expected=2200)) == 2200
    segments = store.load_segments(unique)
    assert [len(segments[(unique, p)]) for p in range(2)] == [1, 1], "rows grow with gaps, not with traffic"


def test_a_batch_that_cannot_pass_is_copied_by_the_record_path_in_order_and_the_partition_returns_to_batches(
    apache_kafka: StackEndpoints, store: Store, unique: str, api: str, instance: dg.DagsterInstance
) -> None:
    source, destination = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    create_topics(source, {unique: 1})
    create_topics(destination, {unique: 1}, config={"max.message.bytes": "20000"})
    small = _source_records(unique, 1, 20, 100)
    produce(source, small[:10])  # small batches: they pass
    big = [{**r, "value": b"b" * 1000} for r in _source_records(unique, 1, 100, 1000)]
    produce(source, big, **{"linger.ms": 200, "batch.size": 1_000_000})  # one batch of ~100 KB: too large
    create_connector(
        store, connector_properties(apache_kafka, unique, **{"topics.whitelist": unique, **BATCHES}), {0: [(unique, 0)]}
    )
    runner = TaskThread.start(store, unique)
    wait_until(lambda: store.load_offsets(unique) == {(unique, 0): 110}, timeout=60, what="110 copied")
    # Once the record path has copied past the large batch, the partition's next look for lanes (every second) moves
    # it back; records produced before that look are the record path's to copy, so the test awaits it.
    wait_until(
        lambda: sum("partition(s) copied as batches" in e for e in runner.events) == 2, timeout=60, what="batches again"
    )
    produce(source, small[10:])  # back on the batch path
    wait_until(lambda: store.load_offsets(unique) == {(unique, 0): 120}, timeout=60, what="120 copied")
    assert runner.finish() is TaskExit.STOPPED

    copies = consume_all(destination, unique, 1, expected=120)
    originals = consume_all(source, unique, 1, expected=120)
    assert _as_read(copies, strip_provenance=True) == _as_read(originals), "every record once, in order"
    by_path = [provenance.parse(c.headers) is not None for c in sorted(copies, key=lambda c: c.offset)]
    assert by_path == [False] * 10 + [True] * 100 + [False] * 10, "batches, the large batch by records, batches"
    assert any("larger than the destination topic's max.message.bytes" in e for e in runner.events), runner.events

    # Counted where an operator looks: the hand-back by its reason, the records by the path that copied them.
    assert _scraped(api, "mirus_batch_hand_backs_total", unique, "reason") == {
        reason: (1 if reason == "too_large" else 0) for reason in HAND_BACK_REASONS
    }
    assert _scraped(api, "mirus_batch_replicated_records_total", unique, "topic") == {unique: 20}
    assert _scraped(api, "mirus_replicated_records_total", unique, "topic") == {unique: 120}
    # Each record's latency, whichever path copied it (a batch's records at its first record's timestamp).
    assert _scraped(api, "mirus_replication_latency_seconds_count", unique, "topic") == {unique: 120}
    row = _asset_row(store, instance, unique)
    assert row == {"connector": unique, "as batches": "20", "by records": "100"} | {
        reason: ("1" if reason == "too_large" else "0") for reason in HAND_BACK_REASONS
    }, row


def test_a_topic_that_keeps_append_times_is_copied_by_records_with_the_times_a_source_consumer_reads(
    apache_kafka: StackEndpoints, store: Store, unique: str, api: str
) -> None:
    # A consumer reads every record of a LogAppendTime batch at the broker's append time; the records' own fields keep
    # their producer's timestamps, which a copy of the batch's bytes would show in a CreateTime destination topic.
    source, destination = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    create_topics(source, {unique: 1}, config={"message.timestamp.type": "LogAppendTime"})
    create_topics(destination, {unique: 1})
    records = _source_records(unique, 1, 60, 100)  # stamped a minute ago by their producer
    produce(source, records[:30], **{"linger.ms": 50})
    create_connector(
        store, connector_properties(apache_kafka, unique, **{"topics.whitelist": unique, **BATCHES}), {0: [(unique, 0)]}
    )
    runner = TaskThread.start(store, unique)
    wait_until(lambda: store.load_offsets(unique) == {(unique, 0): 30}, timeout=60, what="30 copied")
    produce(source, records[30:], **{"linger.ms": 50})
    wait_until(lambda: store.load_offsets(unique) == {(unique, 0): 60}, timeout=60, what="60 copied")
    hand_backs = _scraped(api, "mirus_batch_hand_backs_total", unique, "reason")
    assert runner.finish() is TaskExit.STOPPED

    originals = consume_all(source, unique, 1, expected=60)
    assert {r.timestamp for r in originals}.isdisjoint(r["timestamp"] for r in records), "append times, read so"
    copies = consume_all(destination, unique, 1, expected=60)
    assert _as_read(copies, strip_provenance=True) == _as_read(originals), "the timestamps a source consumer reads"
    assert all(provenance.parse(c.headers) is not None for c in copies), "every record by the record path"
    assert hand_backs == {reason: (1 if reason == "append_time" else 0) for reason in HAND_BACK_REASONS}, hand_backs
    assert any("keeps append times" in e for e in runner.events), runner.events


def test_batches_of_a_compacted_topic_are_handed_back_and_counted_as_gaps(
    apache_kafka: StackEndpoints, store: Store, unique: str, api: str, instance: dg.DagsterInstance
) -> None:
    end = compacted_with_gaps(apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers, unique)
    create_connector(
        store, connector_properties(apache_kafka, unique, **{"topics.whitelist": unique, **BATCHES}), {0: [(unique, 0)]}
    )
    runner = TaskThread.start(store, unique)
    wait_until(lambda: store.load_offsets(unique) == {(unique, 0): end}, timeout=60, what="the partition copied")
    hand_backs = wait_until(
        lambda: (counted := _scraped(api, "mirus_batch_hand_backs_total", unique, "reason"))["gaps"] and counted,
        what="hand-backs for gaps counted",
    )
    assert runner.finish() is TaskExit.STOPPED
    assert any("its inner offsets have gaps" in e for e in runner.events), runner.events
    assert set(hand_backs) == set(HAND_BACK_REASONS)
    assert hand_backs["too_large"] == hand_backs["magic"] == hand_backs["problem"] == 0, hand_backs
    as_batches = _scraped(api, "mirus_batch_replicated_records_total", unique, "topic")[unique]
    assert 5 <= as_batches < _scraped(api, "mirus_replicated_records_total", unique, "topic")[unique]
    row = _asset_row(store, instance, unique)
    assert int(row["gaps"]) == _scraped(api, "mirus_batch_hand_backs_total", unique, "reason")["gaps"] >= 1, row
    assert int(row["as batches"]) == as_batches, row


def test_two_flows_in_opposite_directions_on_identity_names_never_copy_a_copy_back(
    apache_kafka: StackEndpoints, store: Store, unique: str
) -> None:
    a, b = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    create_topics(a, {unique: 1})
    create_topics(b, {unique: 1})
    produce(a, _source_records(unique, 1, 50, 100))
    there = connector_properties(apache_kafka, unique, **{"topics.whitelist": unique, **BATCHES})
    back = {
        **there,
        "name": f"{unique}-back",
        "consumer.bootstrap.servers": b,
        "destination.consumer.bootstrap.servers": a,
    }
    create_connector(store, there, {0: [(unique, 0)]})
    create_connector(store, back, {0: [(unique, 0)]})
    runners = [TaskThread.start(store, unique), TaskThread.start(store, f"{unique}-back")]
    # B's copies are read by the flow back and skipped: its offset moves past them, nothing reaches A.
    wait_until(lambda: store.load_offsets(unique) == {(unique, 0): 50}, what="A to B")
    wait_until(lambda: store.load_offsets(f"{unique}-back") == {(unique, 0): 50}, what="B's copies passed over")
    produce(b, _source_records(unique, 1, 10, 100))  # written at B: copied to A, and that copy not back to B
    wait_until(lambda: store.load_offsets(f"{unique}-back") == {(unique, 0): 60}, what="B to A")
    wait_until(lambda: store.load_offsets(unique) == {(unique, 0): 60}, what="A's copies passed over")
    assert [r.finish() for r in runners] == [TaskExit.STOPPED, TaskExit.STOPPED]
    assert len(consume_all(a, unique, 1, expected=60)) == 60, "A: its 50 and B's 10, nothing twice"
    assert len(consume_all(b, unique, 1, expected=60)) == 60, "B: A's 50 and its 10, nothing twice"


def _copied_as_batches_then_stopped(
    apache_kafka: StackEndpoints, store: Store, unique: str, partitions: int, records: list[dict[str, object]],
    skipping: bool,
) -> None:  # fmt: skip
    """A connector committing an hour apart (so that a run killed later commits nothing) copies `records` as batches
    and stops: the final commit stores where each partition's next copy goes."""
    extra = {"topics.whitelist": unique, "offset.flush.interval.ms": 3_600_000, **BATCHES}
    properties = connector_properties(apache_kafka, unique, **extra, **{"start.after.destination.copies": skipping})
    create_connector(store, properties, {0: [(unique, p) for p in range(partitions)]})
    produce(apache_kafka.source_bootstrap_servers, records)
    first = TaskThread.start(store, unique)
    wait_until(lambda: any("copied as batches" in e for e in first.events), what="the partitions on the batch path")
    consume_all(apache_kafka.destination_bootstrap_servers, unique, partitions, expected=len(records))
    assert first.finish() is TaskExit.STOPPED


@contextmanager
def _killed_when_done(apache_kafka: StackEndpoints, store: Store, connector: str, tmp_path: Path) -> Iterator[Path]:
    """The connector's task run as `mirus task run` in a process of its own, its partitions on the batch path and
    its start's commit made (the loop's first, which stores the offsets copied by then: the block's records must
    come after it), and killed -9 when the block ends; yields its log."""
    env = {**os.environ, "MIRUS_DATABASE_URL": apache_kafka.database_url}
    argv = [sys.executable, "-c", "from mirus.cli.main import main; main()", "task", "run", connector, "0"]
    log = tmp_path / "killed.log"
    with open(log, "w") as out:
        killed = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: "copied as batches" in log.read_text(), what="the killed run's batch path")
            # The lease's heartbeat moves at the claims, then at each commit, the loop's first included (a partition
            # claim before the lanes took it moved it too): the next move after the lanes start is a commit's.
            lanes_started = _heartbeat(store, connector)
            wait_until(lambda: _heartbeat(store, connector) > lanes_started, what="the killed run's first commit")
            yield log
        finally:
            killed.send_signal(signal.SIGKILL)
            killed.wait(10)


def _heartbeat(store: Store, connector: str) -> datetime:
    lease = store.lease_of(connector, 0)
    assert lease is not None and lease.heartbeat_at is not None, lease
    return lease.heartbeat_at


@pytest.mark.parametrize("skipping", [False, True], ids=["re-sent-and-counted", "resumed-after-the-copies"])
def test_a_kill_after_batches_were_copied_re_sends_them_counted_or_resumes_after_them(
    apache_kafka: StackEndpoints, store: Store, unique: str, tmp_path: Path, skipping: bool
) -> None:
    """Batch copies carry no header: a start finds those made after the last commit by their bytes, and with
    start.after.destination.copies resumes after them, so a kill -9 writes nothing twice."""
    source, destination = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    create_topics(source, {unique: 2})
    create_topics(destination, {unique: 2})
    records = _source_records(unique, 2, 600, 100)
    _copied_as_batches_then_stopped(apache_kafka, store, unique, 2, records[:200], skipping)
    with _killed_when_done(apache_kafka, store, unique, tmp_path):
        produce(source, records[200:500], **{"linger.ms": 20})
        consume_all(destination, unique, 2, expected=500)
    assert store.load_offsets(unique) == {(unique, 0): 100, (unique, 1): 100}, "the killed run committed nothing"

    last = TaskThread.start(store, unique)
    wait_until(lambda: any("replicating" in e for e in last.events), timeout=60, what="the partitions started")
    if skipping:  # the offsets after the copies are stored at once, with the copies' segments
        assert store.load_offsets(unique) == {(unique, 0): 250, (unique, 1): 250}
        assert {tp: [(s.source_start, s.destination_start, s.count) for s in segments]
                for tp, segments in store.load_segments(unique).items()} == {
            (unique, 0): [(0, 0, 250)], (unique, 1): [(0, 0, 250)]
        }  # fmt: skip
    produce(source, records[500:])
    copies = consume_all(destination, unique, 2, expected=600 if skipping else 900)
    assert last.finish() is TaskExit.STOPPED
    assert store.load_offsets(unique) == {(unique, 0): 300, (unique, 1): 300}
    values = [c.value for c in copies]
    resent = next(f for f in StoreCollector(store).collect() if f.name == "mirus_records_resent")
    counted = sum(s.value for s in resent.samples if s.labels["connector"] == unique and s.name.endswith("_total"))
    assert counted == (0 if skipping else 300)
    if skipping:
        assert sorted(values) == sorted(r["value"] for r in records), "every record once"
        assert any("resuming after 300 record(s) copied since the last commit" in e for e in last.events), last.events
    else:
        assert len(values) == 900 and set(values) == {r["value"] for r in records}, "300 re-sent, nothing lost"
        assert any("re-sending 300 record(s) copied" in e for e in last.events), last.events


def test_a_kill_after_copies_of_both_paths_in_turn_resumes_after_the_last_of_them(
    apache_kafka: StackEndpoints, store: Store, unique: str, tmp_path: Path
) -> None:
    """Past one commit a partition is copied as batches, then by the record path (a batch too large for the
    destination), then as batches again; after a kill -9 the start finds where the last copy ends, whichever path
    made it, and resumes there: every record once, in order."""
    source, destination = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    create_topics(source, {unique: 1})
    create_topics(destination, {unique: 1}, config={"max.message.bytes": "20000"})
    small = _source_records(unique, 1, 80, 100)
    big = [{**r, "value": b"b" * 1000} for r in _source_records(unique, 1, 100, 1000)]
    _copied_as_batches_then_stopped(apache_kafka, store, unique, 1, small[:20], skipping=True)
    with _killed_when_done(apache_kafka, store, unique, tmp_path) as log:
        produce(source, small[20:40], **{"linger.ms": 20})
        consume_all(destination, unique, 1, expected=40)
        produce(source, big, **{"linger.ms": 200, "batch.size": 1_000_000})  # one batch of ~100 KB: too large
        consume_all(destination, unique, 1, expected=140)
        wait_until(lambda: log.read_text().count("copied as batches") == 2, what="back on the batch path")
        produce(source, small[40:60], **{"linger.ms": 20})
        copies = consume_all(destination, unique, 1, expected=160)
    assert store.load_offsets(unique) == {(unique, 0): 20}, "the killed run committed nothing"
    by_path = [provenance.parse(c.headers) is not None for c in sorted(copies, key=lambda c: c.offset)]
    assert by_path == [False] * 40 + [True] * 100 + [False] * 20, "batches, records, batches past the commit"

    last = TaskThread.start(store, unique)
    wait_until(lambda: any("replicating" in e for e in last.events), timeout=60, what="the partition started")
    assert any("resuming after 140 record(s) copied since the last commit" in e for e in last.events), last.events
    assert store.load_offsets(unique) == {(unique, 0): 160}, "after the last copy, whichever path made it"
    segments = store.load_segments(unique)[(unique, 0)]  # the batch copies' provenance, stored at the start
    assert [(s.source_start, s.destination_start, s.count) for s in segments] == [(0, 0, 40), (140, 140, 20)]
    produce(source, small[60:])
    copies = consume_all(destination, unique, 1, expected=180)
    assert last.finish() is TaskExit.STOPPED
    assert store.load_offsets(unique) == {(unique, 0): 180}
    originals = consume_all(source, unique, 1, expected=180)
    assert _as_read(copies, strip_provenance=True) == _as_read(originals), "every record once, in order"


def test_copy_mode_batches_is_refused_with_exactly_once() -> None:
    with pytest.raises(ConnectorConfigError, match=r"copy\.mode: must be records with exactly\.once\.support"):
        validate_submission(
            {
                "name": "eos-batches",
                "consumer.bootstrap.servers": "a:9092",
                "destination.consumer.bootstrap.servers": "b:9092",
                "topics.whitelist": "t",
                "exactly.once.support": "required",
                "copy.mode": "batches",
            }
        )
