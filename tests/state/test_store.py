"""The Postgres store's guarantees that the engine relies on: versions, generations, fencing, handoff."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Engine, column, event, text
from sqlalchemy import table as sql_table

from mirus_dagster.settings import StackEndpoints
from replicator.assignment import SourcePartition
from replicator.state.database import alembic_config, upgrade
from replicator.state.records import ConnectorState, FencedError, MetricInterval, PartitionHealth, UnknownConnectorError
from replicator.state.store import Store
from tests.fixtures.engine_helpers import insert_partition_sample, metric_row, private_database


def test_each_put_is_a_new_version_and_delete_keeps_offsets(store: Store, unique: str) -> None:
    assert store.put_connector(unique, {"name": unique, "tasks.max": "1"}, 1) == 1
    assert store.put_connector(unique, {"name": unique, "tasks.max": "3"}, 3) == 2
    record = store.get_connector(unique)
    assert (record.version, record.tasks_max, record.properties["tasks.max"], record.state) == (2, 3, "3", "RUNNING")

    lease = store.claim_task(unique, 0, "me")
    store.commit(lease, {("t", 0): 10})
    assert store.delete_connector(unique)
    with pytest.raises(UnknownConnectorError):
        store.get_connector(unique)
    assert store.lease_of(unique, 0) is None
    # As in Kafka Connect: a connector created again under the same name resumes.
    assert store.load_offsets(unique) == {("t", 0): 10}


def test_a_rounds_flows_are_written_together_and_a_deleted_connectors_is_dropped(store: Store, unique: str) -> None:
    names = [f"{unique}-{i}" for i in range(3)]
    for name in names:
        store.put_connector(name, {"name": name}, 1)
    store.update_flow(names[0], problems={"topic t": "old"})
    store.delete_connector(names[2])  # deleted after the watcher polled it
    store.update_flows(
        {
            names[0]: {"problems": {}, "source_cluster_id": "a"},
            names[1]: {"heartbeats": [[5, 1000]]},
            names[2]: {"problems": {"x": "y"}},
        }
    )
    assert store.flow(names[0]).problems == {} and store.flow(names[0]).source_cluster_id == "a"
    assert store.flow(names[1]).heartbeats == [[5, 1000]]
    assert store.flow(names[2]).problems == {}, "no flow for a connector that no longer exists"


def test_a_new_generation_only_when_membership_changes(store: Store, unique: str) -> None:
    store.put_connector(unique, {"name": unique}, 2)
    assert store.write_assignment(unique, {0: [("a", 0), ("a", 1)], 1: [("b", 0)]}) == 1
    assert store.write_assignment(unique, {1: [("b", 0)], 0: [("a", 1), ("a", 0)]}) is None  # reordered only
    assert store.write_assignment(unique, {0: [("a", 0)], 1: [("b", 0), ("a", 1)]}) == 2
    assert store.read_assignment(unique) == {0: [("a", 0)], 1: [("a", 1), ("b", 0)]}
    assert store.read_assignment(unique, 1) == {0: [("a", 0), ("a", 1)], 1: [("b", 0)]}
    assert store.write_assignment(unique, {}) == 3  # everything gone is a change too
    assert store.read_assignment(unique) == {}


def test_old_assignment_generations_are_pruned_and_recent_ones_kept(store: Store, unique: str) -> None:
    store.put_connector(unique, {"name": unique}, 1)
    for generation in range(1, 26):
        assert store.write_assignment(unique, {0: [("t", generation)]}) == generation
    assert store.read_assignment(unique) == {0: [("t", 25)]}
    assert store.read_assignment(unique, 16) == {0: [("t", 16)]}  # a task that saw it moments ago still reads it
    assert store.read_assignment(unique, 15) == {}  # older history is gone
    with store.engine.connect() as conn:
        kept = conn.execute(text("SELECT count(*) FROM assignments WHERE connector = :c"), {"c": unique}).scalar()
    assert kept == 10


def test_a_fenced_instance_cannot_write(store: Store, unique: str) -> None:
    store.put_connector(unique, {"name": unique}, 1)
    old = store.claim_task(unique, 0, "old")
    store.commit(old, {("t", 0): 5})
    new = store.claim_task(unique, 0, "new")
    assert new.epoch == old.epoch + 1

    with pytest.raises(FencedError):
        store.commit(old, {("t", 0): 99})
    with pytest.raises(FencedError):
        store.claim_partitions(old, [("t", 1)], timedelta(seconds=30))
    assert store.load_offsets(unique) == {("t", 0): 5}
    store.commit(new, {("t", 0): 7})
    assert store.load_offsets(unique) == {("t", 0): 7}


def test_a_partition_moves_only_when_released_or_its_owner_is_stale(store: Store, unique: str) -> None:
    store.put_connector(unique, {"name": unique}, 2)
    first = store.claim_task(unique, 0, "first")
    second = store.claim_task(unique, 1, "second")
    assert store.claim_partitions(first, [("t", 0), ("t", 1)], timedelta(seconds=30)) == [("t", 0), ("t", 1)]

    assert store.claim_partitions(second, [("t", 0), ("t", 1)], timedelta(seconds=30)) == []
    store.release_partitions(first, [("t", 0)])
    assert store.claim_partitions(second, [("t", 0), ("t", 1)], timedelta(seconds=30)) == [("t", 0)]

    with store.engine.begin() as conn:  # the first task stopped heartbeating a minute ago (crashed)
        conn.execute(
            text(
                "UPDATE task_leases SET heartbeat_at = now() - interval '1 minute' WHERE connector = :c AND task_id = 0"
            ),
            {"c": unique},
        )
    assert store.claim_partitions(second, [("t", 1)], timedelta(seconds=30)) == [("t", 1)]


def test_connector_statuses_reads_every_connector_in_one_query(store: Store, unique: str) -> None:
    names = [f"{unique}-{i}" for i in range(3)]
    for name in names:
        store.put_connector(name, {"name": name, "consumer.sasl.password": "${env:PW}"}, 2)
        store.write_assignment(name, {0: [("a", 0), ("a", 1)], 1: [("b", 0)]})
        lease = store.claim_task(name, 0, "me")
        store.claim_partitions(lease, [("a", 0), ("a", 1)], timedelta(seconds=30))
        store.set_partition_state(lease, ("a", 1), PartitionHealth.PAUSED, "destination topic 'a' does not exist")
        store.record_snapshot(name, "source", {}, "source cluster metadata unavailable")
        store.record_snapshot(name, "destination", {}, "old error")
        store.record_snapshot(name, "destination", {"a": 2}, None)
    store.record_restart(names[0], 0)
    statements: list[str] = []

    def count(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        statements.append(statement)

    event.listen(store.engine, "before_cursor_execute", count)
    try:
        statuses = {s.name: s for s in store.connector_statuses() if s.name in names}
    finally:
        event.remove(store.engine, "before_cursor_execute", count)

    assert len(statements) == 1
    assert sorted(statuses) == names
    first = statuses[names[0]]
    assert (first.state, first.version, first.assignment_generation) == (ConnectorState.RUNNING, 1, 1)
    assert first.properties["consumer.sasl.password"] == "${env:PW}"
    assert [(t.task_id, t.partitions, t.state, t.restart_attempts) for t in first.tasks] == [
        (0, 2, "RUNNING", 1),
        (1, 1, "UNASSIGNED", 0),
    ]
    assert first.tasks[0].heartbeat_at is not None and first.tasks[1].heartbeat_at is None
    assert first.metadata_errors == {"source": "source cluster metadata unavailable"}
    paused = first.unhealthy_partitions[("a", 1)]
    assert (paused.task_id, paused.state, paused.reason) == (
        0,
        PartitionHealth.PAUSED,
        "destination topic 'a' does not exist",
    )
    assert list(first.unhealthy_partitions) == [("a", 1)]


def test_tasks_sharing_a_topic_commit_their_own_partitions_without_undoing_each_others(
    store: Store, unique: str
) -> None:
    store.put_connector(unique, {"name": unique}, 2)
    first, second = store.claim_task(unique, 0, "first"), store.claim_task(unique, 1, "second")
    store.commit(first, {("t", 0): 10, ("t", 2): 30, ("u", 1): 4})
    store.commit(second, {("t", 1): 20, ("t", 7): 70})
    store.commit(first, {("t", 0): 11})  # only what changed: the others' and its own earlier offsets stay
    assert store.load_offsets(unique) == {("t", 0): 11, ("t", 1): 20, ("t", 2): 30, ("t", 7): 70, ("u", 1): 4}
    assert store.load_offsets(unique, [("t", 7), ("t", 3), ("u", 1)]) == {("t", 7): 70, ("u", 1): 4}
    # Exactly-once: where the copies end is kept per partition too; a commit without one keeps the stored one.
    store.commit(first, {("t", 0): 12, ("t", 2): 31}, {("t", 0): 500})
    store.commit(second, {("t", 1): 21}, {("t", 1): 600})
    store.commit(first, {("t", 2): 32})
    assert store.load_destination_offsets(unique, [("t", 0), ("t", 1), ("t", 2)]) == {("t", 0): 500, ("t", 1): 600}
    assert store.load_offsets(unique, [("t", 0), ("t", 1), ("t", 2)]) == {("t", 0): 12, ("t", 1): 21, ("t", 2): 32}
    # Every partition of a topic at once replaces its array; every partition of a shorter one keeps the rest.
    store.commit(first, {("t", p): 100 + p for p in range(8)})
    store.commit(second, {("t", p): 200 + p for p in range(3)})
    assert store.load_offsets(unique, [("t", p) for p in range(8)]) == {
        ("t", p): (200 if p < 3 else 100) + p for p in range(8)
    }


def test_tasks_sharing_a_topic_record_their_own_lags_as_one_row_per_topic(store: Store, unique: str) -> None:
    store.put_connector(unique, {"name": unique}, 2)
    start = datetime(2026, 11, 25, 10, tzinfo=UTC)
    written: list[int] = []

    def rows_written(_conn: object, cursor: Any, statement: str, *_args: object) -> None:
        if statement.lstrip().startswith("INSERT INTO partition_lags"):
            written.append(cursor.rowcount)

    def record(at: datetime, lags: dict[SourcePartition, int]) -> None:
        store.record_metrics(unique, MetricInterval([], lags, at))

    event.listen(store.engine, "after_cursor_execute", rows_written)
    try:
        # One task's interval of 10,000 changed lags over 20 topics: one statement writing a row per topic.
        record(start, {(f"t{p % 20:02d}", p // 20): p for p in range(10_000)})
        assert written == [20]
        # Two tasks holding different partitions of "t00": each writes only its own partitions' elements, whichever
        # interval ends first; the topic's array grows with a partition beyond its end.
        record(start + timedelta(seconds=2), {("t00", 0): 7, ("t00", 1): 8})
        record(start + timedelta(seconds=1), {("t00", 2): 9, ("t00", 600): 6})
        # A late report of an older interval (an old owner's) loses where a newer measurement is stored.
        record(start + timedelta(seconds=1), {("t00", 1): 99, ("t00", 3): 10})
    finally:
        event.remove(store.engine, "after_cursor_execute", rows_written)
    assert written == [20, 1, 1, 1]

    lags = store.partition_lags(unique)
    assert len(lags) == 10_001
    assert [lags[("t00", p)] for p in (0, 1, 2, 3, 4, 600)] == [7, 8, 9, 10, 80, 6]
    assert lags[("t19", 499)] == 9_999 and ("t00", 500) not in lags  # never measured: no value, not a lag of 0
    exported = {(r.topic, r.partition): r.lag for r in store.known_partition_lags() if r.connector == unique}
    assert exported == lags
    with store.engine.connect() as conn:
        stored = conn.execute(text("SELECT count(*) FROM partition_lags WHERE connector = :c"), {"c": unique})
        assert stored.scalar_one() == 20
    store.delete_connector(unique)
    assert store.partition_lags(unique) == {}


def test_hand_backs_by_reason_add_up_across_tasks_and_intervals(store: Store, unique: str) -> None:
    store.put_connector(unique, {"name": unique}, 2)
    end = datetime(2026, 12, 3, 10, tzinfo=UTC)
    samples = [
        replace(metric_row("orders", end, 4), batch_records=3, batch_bytes=300, handed_back={"gaps": 2}),
        replace(metric_row("orders", end, 2), task_id=1, handed_back={"gaps": 1, "paused": 1}),
        metric_row("orders", end + timedelta(seconds=10), 5),  # the record path alone: nothing of batches
        metric_row("other", end, 1),
    ]
    for sample in samples:
        store.record_metrics(unique, MetricInterval([sample], {}, end))
    totals = {t.topic: t for t in store.topic_totals() if t.connector == unique}
    orders, other = totals["orders"], totals["other"]
    assert (orders.records, orders.batch_records, orders.batch_bytes) == (11, 3, 300)
    assert orders.handed_back == {"gaps": 3, "paused": 1}
    assert (other.batch_records, other.handed_back) == (0, {})


def test_an_operator_sets_and_forgets_single_offsets_of_a_stopped_connector(store: Store, unique: str) -> None:
    store.put_connector(unique, {"name": unique}, 1)
    lease = store.claim_task(unique, 0, "me")
    store.commit(lease, {("t", 0): 10, ("t", 1): 20, ("t", 3): 40}, {("t", 0): 100, ("t", 1): 200})
    store.finish_task(lease, "STOPPED")
    store.set_connector_state(unique, ConnectorState.PAUSED)
    store.alter_offsets_of_stopped(unique, {("t", 3): None, ("t", 1): 5, ("v", 2): 9}, timedelta(seconds=30))
    assert store.load_offsets(unique) == {("t", 0): 10, ("t", 1): 5, ("v", 2): 9}
    # A hand-set offset no longer says where its copies end at the destination; the others keep theirs.
    assert store.load_destination_offsets(unique, [("t", 0), ("t", 1)]) == {("t", 0): 100}
    store.alter_offsets_of_stopped(unique, {("v", 2): None}, timedelta(seconds=30))
    assert store.load_offsets(unique) == {("t", 0): 10, ("t", 1): 5}
    store.alter_offsets_of_stopped(unique, None, timedelta(seconds=30))
    assert store.load_offsets(unique) == {}


def _stored_at(stack: StackEndpoints, name: str, revision: str, table: str, rows: list[dict[str, Any]]) -> Engine:
    """A private database downgraded to `revision`, with `rows` stored in `table` as that revision stores them."""
    engine = private_database(stack, name)
    command.downgrade(alembic_config(engine), revision)
    with engine.begin() as conn:
        conn.execute(sql_table(table, *(column(c) for c in rows[0])).insert(), rows)
    return engine


def test_the_upgrade_to_offsets_per_topic_keeps_every_stored_offset(stack: StackEndpoints, unique: str) -> None:
    rows = [("t", 0, 10, None), ("t", 3, 40, 400), ("u", 1, 5, None), ("heartbeats", 0, 2, None)]
    engine = _stored_at(
        stack,
        unique,
        "0004",
        "offsets",
        [  # offsets a row per partition, as stored before
            {"connector": unique, "topic": t, "partition": p, "offset": o, "epoch": 3, "destination_offset": d}
            for t, p, o, d in rows
        ],
    )
    upgrade(engine)
    store = Store(engine)
    assert store.load_offsets(unique) == {("t", 0): 10, ("t", 3): 40, ("u", 1): 5, ("heartbeats", 0): 2}
    assert store.load_destination_offsets(unique, [("t", 0), ("t", 3)]) == {("t", 3): 400}
    store.put_connector(unique, {"name": unique}, 1)
    store.commit(store.claim_task(unique, 0, "me"), {("t", 1): 20})
    assert store.load_offsets(unique, [("t", 0), ("t", 1), ("t", 3)]) == {("t", 0): 10, ("t", 1): 20, ("t", 3): 40}
    command.downgrade(alembic_config(engine), "0004")  # and back: a row per stored partition again
    with engine.connect() as conn:
        back = conn.execute(text('SELECT topic, partition, "offset", destination_offset FROM offsets ORDER BY 1, 2'))
        assert sorted(back) == sorted([*rows, ("t", 1, 20, None)])
    engine.dispose()


def test_the_upgrade_to_lags_per_topic_keeps_every_stored_lag(stack: StackEndpoints, unique: str) -> None:
    at = datetime(2026, 11, 25, 10, tzinfo=UTC)
    later = at + timedelta(seconds=10)
    rows = [("t", 0, 5, at), ("t", 3, None, at), ("t", 4, 12, later), ("u", 1, 0, later)]
    engine = _stored_at(
        stack,
        unique,
        "0006",
        "partition_lags",
        [  # lags a row per partition, as stored before
            {"connector": unique, "topic": t, "partition": p, "lag": lag, "measured_at": m} for t, p, lag, m in rows
        ],
    )
    upgrade(engine)
    store = Store(engine)
    assert store.partition_lags(unique) == {("t", 0): 5, ("t", 3): None, ("t", 4): 12, ("u", 1): 0}
    # Each partition keeps when it was measured: an interval between the two stored ones overwrites only the older.
    between = at + timedelta(seconds=5)
    store.record_metrics(unique, MetricInterval([], {("t", 0): 6, ("t", 4): 13, ("t", 1): 1}, between))
    assert store.partition_lags(unique) == {("t", 0): 6, ("t", 1): 1, ("t", 3): None, ("t", 4): 12, ("u", 1): 0}
    store.put_connector(unique, {"name": unique}, 1)
    assert {(r.topic, r.partition): r.lag for r in store.known_partition_lags()} == {
        ("t", 0): 6,
        ("t", 1): 1,
        ("t", 4): 12,
        ("u", 1): 0,
    }
    command.downgrade(alembic_config(engine), "0006")  # and back: a row per measured partition again
    with engine.connect() as conn:
        back = conn.execute(text("SELECT topic, partition, lag, measured_at FROM partition_lags"))
        assert sorted(back, key=lambda r: (r[0], r[1])) == [
            ("t", 0, 6, between),
            ("t", 1, 1, between),
            ("t", 3, None, at),
            ("t", 4, 12, later),
            ("u", 1, 0, later),
        ]
    engine.dispose()


def test_the_upgrade_to_samples_per_topic_sums_each_intervals_partitions(stack: StackEndpoints, unique: str) -> None:
    engine = private_database(stack, unique)
    command.downgrade(alembic_config(engine), "0005")  # samples a row per partition, as stored before
    end = datetime(2026, 11, 25, 10, 0, 10, tzinfo=UTC)
    later = end + timedelta(seconds=10)
    fast, slow = (
        metric_row("orders", end, 4),
        replace(metric_row("orders", end, 2), latency_min_ms=9, latency_max_ms=900, lag=None),
    )
    slow = replace(slow, latency_histogram={**slow.latency_histogram, "10": 1, "25": 1})  # one record at 9 ms
    per_partition = [
        (0, fast),
        (1, slow),
        (2, fast),  # one interval of task 0: summed into one row
        (0, metric_row("orders", later, 1)),  # the next interval: a row of its own
        (0, metric_row("other", end, 3)),
        (3, replace(fast, task_id=1)),
    ]
    with engine.begin() as conn:
        for partition, row in per_partition:
            insert_partition_sample(conn, unique, partition, row)
        first_id = conn.execute(text("SELECT min(id) FROM metric_samples")).scalar_one()
    upgrade(engine)
    store = Store(engine)
    samples = {(s["task_id"], s["topic"], s["interval_end"]): s for s in store.metric_samples(unique)}
    assert set(samples) == {(0, "orders", end), (0, "orders", later), (0, "other", end), (1, "orders", end)}
    summed = samples[(0, "orders", end)]
    assert summed["id"] == first_id and "partition" not in summed
    assert (summed["records"], summed["bytes"], summed["latency_count"], summed["latency_sum_ms"]) == (
        10,
        100,
        10,
        50 * 4 + 50 * 2 + 50 * 4,
    )
    assert (summed["latency_min_ms"], summed["latency_max_ms"], summed["lag"]) == (9, 900, 14)
    assert summed["latency_histogram"] == {
        bound: 2 * fast.latency_histogram[bound] + slow.latency_histogram[bound] for bound in fast.latency_histogram
    }
    assert summed["latency_histogram"]["+Inf"] == summed["latency_count"]
    assert [samples[k]["records"] for k in [(0, "orders", later), (0, "other", end), (1, "orders", end)]] == [1, 3, 4]

    command.downgrade(alembic_config(engine), "0005")  # and back: a row per topic, of partition -1
    with engine.connect() as conn:
        back = conn.execute(text("SELECT partition, sum(records) FROM metric_samples GROUP BY partition")).all()
    assert back == [(-1, 18)]
    engine.dispose()
