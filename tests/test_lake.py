"""The lake export and Postgres retention: hours land in Parquet once (re-exports replace), and only rows that are
in a sealed hour of the lake and older than the retention leave Postgres."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
from alembic import command
from sqlalchemy import Engine, insert, text

from mirus_dagster.metrics_exporter import StoreCollector
from mirus_dagster.stack import StackEndpoints
from replicator.database import alembic_config, upgrade
from replicator.lake import PART_FILE, PART_GLOB, export_hour, hour_dir, hour_floor, prune, state_path
from replicator.metric_totals import topic_totals
from replicator.metrics import TaskMetrics
from replicator.schema import MetricSample
from replicator.store import MetricRow, Store

from .engine_helpers import connector_properties, private_database


def _row(topic: str, partition: int, end: datetime, records: int, histogram: dict[str, int] | None = None) -> MetricRow:
    counters = TaskMetrics(0).counters_for((topic, partition))
    counters.add(records, records * 10)
    counters.add_latencies(1_000, [950] * records)
    return MetricRow(
        task_id=0, topic=topic, partition=partition, interval_start=end - timedelta(seconds=10), interval_end=end,
        records=records, bytes=records * 10, latency_min_ms=50, latency_max_ms=50, latency_sum_ms=50 * records,
        latency_count=records, latency_histogram=histogram or counters.cumulative_histogram(), lag=7,
    )  # fmt: skip


def _count(engine: Engine, connector: str, table: str = "metric_samples") -> int:
    with engine.connect() as conn:
        return conn.execute(text(f"SELECT count(*) FROM {table} WHERE connector = :c"), {"c": connector}).scalar_one()


def _lake_rows(lake: Path, table: str, hour: datetime, connector: str) -> list[dict]:
    parts = sorted(hour_dir(lake, table, hour).glob(PART_GLOB))
    return [r for part in parts for r in pq.read_table(part).to_pylist() if r["connector"] == connector]


def test_export_is_idempotent_and_prune_removes_only_sealed_hours_past_retention(
    db_engine: Engine, unique: str, tmp_path: Path, stack: StackEndpoints
) -> None:
    store = Store(db_engine)
    props = connector_properties(
        stack, unique, **{"topics.whitelist": "orders", "destination.topic.name.prefix": "dc1."}
    )
    store.put_connector(unique, props, 1)
    now = datetime.now(UTC)
    old, older, recent = hour_floor(now - timedelta(hours=6)), hour_floor(now - timedelta(hours=5)), now
    # A row written before the histogram had its finer buckets: only 100 ms, 1 s, ... and +Inf.
    coarse = {"100": 1, "1000": 3, "10000": 3, "60000": 3, "300000": 3, "600000": 3, "1800000": 3, "3600000": 3,
              "43200000": 3, "+Inf": 3}  # fmt: skip
    store.record_metrics(unique, [
        _row("orders", 0, old + timedelta(minutes=10), 4), _row("orders", 1, old + timedelta(minutes=20), 2),
        _row("orders", 1, old + timedelta(minutes=30), 3, coarse),
        _row("orders", 0, older + timedelta(minutes=5), 5), _row("orders", 0, recent, 1),
    ])  # fmt: skip
    with db_engine.begin() as conn:
        for minutes in (5, 20):
            conn.execute(
                text("INSERT INTO metadata_snapshots (connector, cluster, topics, taken_at) VALUES (:c, 'source', "
                     ":t, :at)"),
                {"c": unique, "t": json.dumps({"orders": 2 + minutes}), "at": old + timedelta(minutes=minutes)},
            )  # fmt: skip

    first = export_hour(db_engine, tmp_path, old, now=now)
    again = export_hour(db_engine, tmp_path, old, now=now)
    assert first.sealed and again.rows == first.rows
    rows = _lake_rows(tmp_path, "metric_samples", old, unique)
    assert sorted(r["records"] for r in rows) == [2, 3, 4]  # once each, however often the hour is exported
    assert {r["destination_topic"] for r in rows} == {"dc1.orders"}
    four = next(r for r in rows if r["records"] == 4)
    assert (four["le_25"], four["le_50"], four["le_100"], four["le_inf"], four["lag"]) == (0, 4, 4, 4, 7)
    three = next(r for r in rows if r["records"] == 3)
    assert (three["le_100"], three["le_250"], three["le_500"], three["le_1000"]) == (1, 1, 1, 3)  # lower bound kept
    snapshots = _lake_rows(tmp_path, "metadata_snapshots", old, unique)
    assert sorted((r["topic"], r["partitions"]) for r in snapshots) == [("orders", 7), ("orders", 22)]
    connectors = [r for r in pq.read_table(state_path(tmp_path, "connectors")).to_pylist() if r["connector"] == unique]
    assert connectors[0]["destination_topic_checking"] is True

    # `older` was exported only a minute after it ended: not sealed, so its rows stay in Postgres.
    assert not export_hour(db_engine, tmp_path, older, now=older + timedelta(minutes=61)).sealed
    result = prune(db_engine, tmp_path, timedelta(hours=3), now=now)
    assert result.metric_samples_deleted >= 3
    assert f"{older:%Y-%m-%d-%H}:00" in result.awaiting_export
    with db_engine.connect() as conn:
        left = conn.execute(
            text("SELECT interval_end FROM metric_samples WHERE connector = :c ORDER BY interval_end"), {"c": unique}
        ).scalars().all()  # fmt: skip
        snapshots_left = conn.execute(
            text("SELECT topics FROM metadata_snapshots WHERE connector = :c"), {"c": unique}
        ).scalars().all()  # fmt: skip
    assert [hour_floor(t) for t in left] == [older, hour_floor(recent)]
    assert snapshots_left == [{"orders": 22}]  # the latest observation is kept: the monitor compares against it

    export_hour(db_engine, tmp_path, older, now=now)
    assert prune(db_engine, tmp_path, timedelta(hours=3), now=now).metric_samples_deleted >= 1
    assert _count(db_engine, unique) == 1  # only the recent row, inside the retention
    assert [r["records"] for r in _lake_rows(tmp_path, "metric_samples", older, unique)] == [5]


def test_the_running_hour_is_exported_incrementally_then_in_full(
    db_engine: Engine, unique: str, tmp_path: Path, stack: StackEndpoints
) -> None:
    store = Store(db_engine)
    store.put_connector(unique, connector_properties(stack, unique, **{"topics.whitelist": "orders"}), 1)
    hour = hour_floor(datetime.now(UTC))
    running, ended = hour + timedelta(minutes=30), hour + timedelta(hours=2)
    store.record_metrics(unique, [_row("orders", 0, hour + timedelta(minutes=10), 1)])
    assert not export_hour(db_engine, tmp_path, hour, now=running).sealed
    store.record_metrics(unique, [_row("orders", 0, hour + timedelta(minutes=11), 2)])
    export_hour(db_engine, tmp_path, hour, now=running)
    parts = sorted(hour_dir(tmp_path, "metric_samples", hour).glob(PART_GLOB))
    assert len(parts) == 2 and parts[0].name == PART_FILE  # the second run wrote only the new sample
    assert sorted(r["records"] for r in _lake_rows(tmp_path, "metric_samples", hour, unique)) == [1, 2]

    assert export_hour(db_engine, tmp_path, hour, now=ended).sealed  # after the hour: one file, everything in it
    assert [p.name for p in hour_dir(tmp_path, "metric_samples", hour).glob(PART_GLOB)] == [PART_FILE]
    assert sorted(r["records"] for r in _lake_rows(tmp_path, "metric_samples", hour, unique)) == [1, 2]


def _counters(store: Store, connector: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every counter and histogram sample the Prometheus exporter shows for `connector`."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in StoreCollector(store).collect() if family.type in ("counter", "histogram")
        for sample in family.samples if sample.labels.get("connector") == connector
    }  # fmt: skip


def test_counters_never_go_down_when_samples_are_pruned_and_lags_keep_the_newest(
    db_engine: Engine, unique: str, tmp_path: Path, stack: StackEndpoints
) -> None:
    store = Store(db_engine)
    store.put_connector(unique, connector_properties(stack, unique, **{"topics.whitelist": "orders"}), 1)
    now = datetime.now(UTC)
    old = hour_floor(now - timedelta(hours=6))
    store.record_metrics(unique, [_row("orders", 0, old + timedelta(minutes=10), 4),
                                  _row("orders", 1, old + timedelta(minutes=20), 2)])  # fmt: skip
    before = _counters(store, unique)
    assert before[("mirus_replicated_records_total", (("connector", unique), ("topic", "orders")))] == 6

    export_hour(db_engine, tmp_path, old, now=now)
    assert prune(db_engine, tmp_path, timedelta(hours=3), now=now).metric_samples_deleted >= 2
    assert _count(db_engine, unique) == 0
    assert _counters(store, unique) == before  # the samples are gone; what they counted is not

    store.record_metrics(unique, [replace(_row("orders", 0, now, 3), lag=2)])
    after = _counters(store, unique)
    assert after[("mirus_replicated_records_total", (("connector", unique), ("topic", "orders")))] == 9
    assert after.keys() == before.keys() and all(after[k] >= before[k] for k in before), (before, after)
    # Lag is the newest sample's, per partition; a late report of an older interval does not overwrite it.
    store.record_metrics(unique, [replace(_row("orders", 0, now - timedelta(minutes=5), 1), lag=40)])
    assert store.partition_lags(unique) == {("orders", 0): 2, ("orders", 1): 7}
    store.delete_connector(unique)
    assert _counters(store, unique) == {} and store.partition_lags(unique) == {}


def test_the_upgrade_that_adds_running_totals_starts_them_from_the_stored_samples(
    stack: StackEndpoints, unique: str
) -> None:
    engine = private_database(stack, unique)
    command.downgrade(alembic_config(engine), "0003")
    now = datetime.now(UTC)
    rows = [_row("orders", 0, now - timedelta(minutes=2), 4), _row("orders", 0, now - timedelta(minutes=1), 1),
            replace(_row("orders", 1, now, 2), lag=None)]  # fmt: skip
    with engine.begin() as conn:
        for row in rows:
            conn.execute(insert(MetricSample).values(connector=unique, **row.__dict__))
    upgrade(engine)
    store = Store(engine)
    store.put_connector(unique, connector_properties(stack, unique, **{"topics.whitelist": "orders"}), 1)

    (totals,) = topic_totals(store)
    assert (totals.topic, totals.records, totals.bytes, totals.latency_count) == ("orders", 7, 70, 7)
    assert totals.histogram == {
        bound: sum(r.latency_histogram[bound] for r in rows) for bound in rows[0].latency_histogram
    }
    assert store.partition_lags(unique) == {("orders", 0): 7, ("orders", 1): None}
    engine.dispose()
