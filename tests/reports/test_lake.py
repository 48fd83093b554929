"""The lake export and Postgres retention: hours land in Parquet once (re-exports replace), and only rows that are
in a sealed hour of the lake and older than the retention leave Postgres."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from alembic import command
from sqlalchemy import Engine, event, text

from mirus.api.metrics import RATE_WINDOW_S, StoreCollector
from mirus_dagster.settings import StackEndpoints
from replicator.assignment import SourcePartition
from replicator.state.database import alembic_config, upgrade
from replicator.state.records import MetricInterval, MetricRow
from replicator.state.store import Store
from reports.lake import PART_FILE, PART_GLOB, export_hour, hour_dir, hour_floor, prune, state_path
from tests.fixtures.engine_helpers import connector_properties, insert_partition_sample, metric_row, private_database


def _interval(*samples: MetricRow, lags: dict[SourcePartition, int] | None = None) -> MetricInterval:
    return MetricInterval(samples, lags or {}, max(r.interval_end for r in samples))


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
    coarse = {
        "100": 1,
        "1000": 3,
        "10000": 3,
        "60000": 3,
        "300000": 3,
        "600000": 3,
        "1800000": 3,
        "3600000": 3,
        "43200000": 3,
        "+Inf": 3,
    }
    store.record_metrics(
        unique,
        _interval(
            metric_row("orders", old + timedelta(minutes=10), 4),
            metric_row("orders", old + timedelta(minutes=20), 2),
            metric_row("orders", old + timedelta(minutes=30), 3, coarse),
            metric_row("orders", older + timedelta(minutes=5), 5),
            metric_row("orders", recent, 1),
        ),
    )
    with db_engine.begin() as conn:
        for minutes in (5, 20):
            conn.execute(
                text(
                    "INSERT INTO metadata_snapshots (connector, cluster, topics, taken_at) VALUES (:c, 'source', "
                    ":t, :at)"
                ),
                {"c": unique, "t": json.dumps({"orders": 2 + minutes}), "at": old + timedelta(minutes=minutes)},
            )

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
    assert connectors[0]["enable_destination_topic_checking"] is True

    # `older` was exported only a minute after it ended: not sealed, so its rows stay in Postgres.
    assert not export_hour(db_engine, tmp_path, older, now=older + timedelta(minutes=61)).sealed
    result = prune(db_engine, tmp_path, timedelta(hours=3), now=now)
    assert result.metric_samples_deleted >= 3
    assert f"{older:%Y-%m-%d-%H}:00" in result.awaiting_export
    with db_engine.connect() as conn:
        left = (
            conn.execute(
                text("SELECT interval_end FROM metric_samples WHERE connector = :c ORDER BY interval_end"),
                {"c": unique},
            )
            .scalars()
            .all()
        )
        snapshots_left = (
            conn.execute(text("SELECT topics FROM metadata_snapshots WHERE connector = :c"), {"c": unique})
            .scalars()
            .all()
        )
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
    store.record_metrics(unique, _interval(metric_row("orders", hour + timedelta(minutes=10), 1)))
    assert not export_hour(db_engine, tmp_path, hour, now=running).sealed
    store.record_metrics(unique, _interval(metric_row("orders", hour + timedelta(minutes=11), 2)))
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
        for family in StoreCollector(store).collect()
        if family.type in ("counter", "histogram")
        for sample in family.samples
        if sample.labels.get("connector") == connector
    }


def test_counters_never_go_down_when_samples_are_pruned_and_lags_keep_the_newest(
    db_engine: Engine, unique: str, tmp_path: Path, stack: StackEndpoints
) -> None:
    store = Store(db_engine)
    store.put_connector(unique, connector_properties(stack, unique, **{"topics.whitelist": "orders"}), 1)
    now = datetime.now(UTC)
    old = hour_floor(now - timedelta(hours=6))
    store.record_metrics(
        unique,
        _interval(
            metric_row("orders", old + timedelta(minutes=10), 4),
            metric_row("orders", old + timedelta(minutes=20), 2),
            lags={("orders", 0): 7, ("orders", 1): 7},
        ),
    )
    before = _counters(store, unique)
    assert before[("mirus_replicated_records_total", (("connector", unique), ("topic", "orders")))] == 6

    export_hour(db_engine, tmp_path, old, now=now)
    assert prune(db_engine, tmp_path, timedelta(hours=3), now=now).metric_samples_deleted >= 2
    assert _count(db_engine, unique) == 0
    assert _counters(store, unique) == before  # the samples are gone; what they counted is not

    store.record_metrics(unique, _interval(replace(metric_row("orders", now, 3), lag=9), lags={("orders", 0): 2}))
    after = _counters(store, unique)
    assert after[("mirus_replicated_records_total", (("connector", unique), ("topic", "orders")))] == 9
    assert after.keys() == before.keys() and all(after[k] >= before[k] for k in before), (before, after)
    # Lag is the newest measured, per partition; a late report of an older interval does not overwrite it.
    store.record_metrics(
        unique, _interval(metric_row("orders", now - timedelta(minutes=5), 1), lags={("orders", 0): 40})
    )
    assert store.partition_lags(unique) == {("orders", 0): 2, ("orders", 1): 7}
    store.delete_connector(unique)
    assert _counters(store, unique) == {} and store.partition_lags(unique) == {}


def test_the_upgrade_that_adds_running_totals_starts_them_from_the_stored_samples(
    stack: StackEndpoints, unique: str
) -> None:
    engine = private_database(stack, unique)
    command.downgrade(alembic_config(engine), "0003")
    now = datetime.now(UTC)
    rows = [
        (0, metric_row("orders", now - timedelta(minutes=2), 4)),
        (0, metric_row("orders", now - timedelta(minutes=1), 1)),
        (1, replace(metric_row("orders", now, 2), lag=None)),
    ]
    with engine.begin() as conn:
        for partition, row in rows:
            insert_partition_sample(conn, unique, partition, row)
    upgrade(engine)
    store = Store(engine)
    store.put_connector(unique, connector_properties(stack, unique, **{"topics.whitelist": "orders"}), 1)

    (totals,) = store.topic_totals()
    assert (totals.topic, totals.records, totals.bytes, totals.latency_count) == ("orders", 7, 70, 7)
    assert totals.histogram == {
        bound: sum(r.latency_histogram[bound] for _, r in rows) for bound in rows[0][1].latency_histogram
    }
    assert store.partition_lags(unique) == {("orders", 0): 7, ("orders", 1): None}
    engine.dispose()


def _samples_read_by_a_scrape(store: Store) -> int:
    """Rows of `metric_samples` that Postgres reads to answer one scrape: each statement of the scrape that names
    the table, run again under EXPLAIN ANALYZE, its scans' rows returned and removed by filters summed."""
    statements: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        if "metric_samples" in statement:
            statements.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", capture)
    try:
        assert list(StoreCollector(store).collect())
    finally:
        event.remove(store.engine, "before_cursor_execute", capture)
    assert statements, "a scrape reads recent samples for its rates"

    def read(node: dict[str, Any]) -> int:
        own = 0
        if node.get("Relation Name") == "metric_samples":
            removed = node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Index Recheck", 0)
            own = (node["Actual Rows"] + removed) * node["Actual Loops"]
        return own + sum(read(child) for child in node.get("Plans", []))

    total = 0
    with store.engine.connect() as conn:
        for statement, parameters in statements:
            (plan,) = conn.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters).scalar_one()
            total += read(plan["Plan"])
    return total


def test_a_scrape_reads_no_sample_older_than_its_rate_window_however_many_are_kept(
    stack: StackEndpoints, unique: str
) -> None:
    engine = private_database(stack, unique)
    store = Store(engine)
    store.put_connector(unique, connector_properties(stack, unique, **{"topics.whitelist": "topic-.*"}), 1)

    def fill(newest: timedelta, oldest: timedelta) -> None:
        """A sample of each of 10 topics every 10 s from `oldest` to `newest` ago, as one task writes them."""
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO metric_samples (connector, task_id, topic, interval_start, interval_end, records,"
                    " bytes, latency_sum_ms, latency_count, latency_histogram, lag)"
                    " SELECT :c, 0, 'topic-' || t, s - interval '10 s', s, 100, 10000, 5000, 100, '{\"+Inf\": 100}', 0"
                    " FROM generate_series(0, 9) AS t,"
                    " generate_series(now() - :oldest, now() - :newest, interval '10 s') AS s"
                ),
                {"c": unique, "oldest": oldest, "newest": newest},
            )
            conn.execute(text("ANALYZE metric_samples"))

    recent = 10 * 3  # every topic at 2, 12 and 22 s ago, well inside the 60 s window
    assert RATE_WINDOW_S >= 60
    fill(timedelta(seconds=2), timedelta(seconds=22))
    fill(timedelta(hours=1), timedelta(hours=24))  # a day of samples at 10 topics x one per 10 s
    day = _samples_read_by_a_scrape(store)
    fill(timedelta(hours=24, seconds=10), timedelta(hours=72))  # three times as many kept
    three_days = _samples_read_by_a_scrape(store)
    with engine.connect() as conn:
        kept = conn.execute(text("SELECT count(*) FROM metric_samples")).scalar_one()
    assert kept > 250_000
    assert 0 < three_days <= day <= recent, (day, three_days)
    engine.dispose()
