"""The data pipeline end to end: real traffic with known source timestamps goes through a replicator task, the
lake assets export it, the Spark reports run on one shared local session, and every number is checked against
what the test itself knows about the records it produced."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster_pyspark import PySparkResource
from pyspark.sql import SparkSession
from sqlalchemy import Engine, text

from assets.lake import platform_lake
from assets.reports import report_assets, report_path
from assets.topology import destination_topics, source_topics
from mirus.waiting import wait_until
from mirus_dagster.constants import LATENCY_REPORT_ASSET, MISSING_CHECK, MISSING_REPORT_ASSET, P99_CHECK
from mirus_dagster.dagster_resources import PlatformDatabase
from mirus_dagster.report_schedule import hour_key
from mirus_dagster.reporting import Reporting, spark_config
from mirus_dagster.settings import StackEndpoints
from replicator.configuration.connector import validate_submission
from replicator.discovery.monitor import KafkaMonitor
from replicator.state.records import MetricInterval
from replicator.state.store import Store
from reports.lake import BUCKET_COLUMNS, PART_FILE, SCHEMAS, export_hour, hour_dir, state_path
from reports.replication import latency_report, missing_partitions_report, throughput_lag_report
from tests.fixtures.engine_helpers import TaskThread, connector_properties, metric_row
from tests.fixtures.kafka_helpers import create_topics, produce

MINUTE = 60_000
HOUR_MS = 60 * MINUTE
# Groups of records on the replicated topic: how far in the past their source timestamp is, and how many. Every
# group sits well inside one histogram bucket (<=1m, 1-5m, 5-10m, 10-30m, 30-60m, 1-12h, >12h) even when the
# replication takes up to a minute, so the bucket counts are exact.
GROUPS = (
    (0, 20),
    (2 * MINUTE, 80),
    (7 * MINUTE, 60),
    (20 * MINUTE, 30),
    (45 * MINUTE, 16),
    (3 * HOUR_MS, 12),
    (30 * HOUR_MS, 2),
)
# Bucket bounds as Mirus and Prometheus define them (upper bound, inclusive) for the expected percentiles.
BOUNDS = (60_000, 300_000, 600_000, 1_800_000, 3_600_000, 43_200_000)


def interpolated(q: float, counts_per_bucket: list[int], bounds: tuple[int, ...]) -> float:
    """Prometheus's histogram_quantile: linear interpolation inside the bucket holding rank q * total."""
    total = sum(counts_per_bucket)
    rank, below = q * total, 0
    for i, count in enumerate(counts_per_bucket):
        if below + count >= rank:
            lower = bounds[i - 1] if i else 0
            return lower + (bounds[i] - lower) * (rank - below) / count
        below += count
    raise AssertionError("rank beyond the histogram")


def nearest_rank(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[max(int(-(-q * len(ordered) // 1)) - 1, 0)]


@dataclass
class Estate:
    connector: str
    topic_a: str
    topic_b: str
    topic_c: str
    ages_a: list[int]  # source-timestamp age of every record replicated from topic_a, at produce time
    ages_c: list[int]
    slack_ms: int  # produce start -> everything acknowledged: how much a latency may exceed the record's age
    bytes: dict[tuple[str, int], int]
    records: dict[tuple[str, int], int]
    first_poll: tuple[datetime, datetime]
    lake: Path
    result: dg.ExecuteInProcessResult


def _rows(path: Path, connector: str) -> list[dict[str, Any]]:
    rows = [r for r in pq.read_table(path).to_pylist() if r["connector"] == connector]
    for r in rows:
        for k, v in r.items():
            if isinstance(v, datetime) and v.tzinfo is None:
                r[k] = v.replace(tzinfo=UTC)
    return rows


@pytest.fixture(scope="module")
def estate(
    stack: StackEndpoints, db_engine: Engine, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Estate]:
    """The connector is deleted at the end: workers and monitors of later modules host every stored connector."""
    store = Store(db_engine)
    u = f"rep-{uuid.uuid4().hex[:8]}"
    a, b, c = f"{u}-a", f"{u}-b", f"{u}-c"
    create_topics(stack.source_bootstrap_servers, {a: 4, b: 1, c: 1})
    # a's destination has fewer partitions (2 of 4), b's destination does not exist.
    create_topics(stack.destination_bootstrap_servers, {f"{a}.mirror": 2, f"{c}.mirror": 1})
    props = connector_properties(
        stack,
        u,
        **{
            "topics.whitelist": f"{a},{b},{c}",
            "destination.topic.name.suffix": ".mirror",
            "enable.partition.matching": "true",
            # leave the destination as it is: the report must see the gaps
            "topic.creation.enable": "false",
            # the source's heartbeats topic (other tests' monitors) is no report's
            "emit.heartbeats.enabled": "false",
        },
    )
    config = validate_submission(props)
    store.put_connector(u, config.raw, config.tasks_max)
    before = datetime.now(UTC)
    plan = KafkaMonitor(store).poll(u).plan
    after = datetime.now(UTC)
    assert sorted(plan.replicate) == [(a, 0), (a, 1), (c, 0)]

    start_ms = time.time_ns() // 1_000_000
    records, expected_records, expected_bytes, ages_a = [], {}, {}, []
    i = 0
    for age, count in GROUPS:
        for _ in range(count):
            partition = i % 2
            key, value = b"k%d" % i, b"v" * (10 + i % 7)
            records.append(
                {"topic": a, "partition": partition, "timestamp": start_ms - age, "key": key, "value": value}
            )
            expected_records[(a, partition)] = expected_records.get((a, partition), 0) + 1
            expected_bytes[(a, partition)] = expected_bytes.get((a, partition), 0) + len(key) + len(value)
            ages_a.append(age)
            i += 1
    ages_c = [2 * MINUTE] * 10
    for n in range(10):
        records.append({"topic": c, "partition": 0, "timestamp": start_ms - ages_c[n], "value": b"c" * 20})
    expected_records[(c, 0)], expected_bytes[(c, 0)] = 10, 200
    # Partitions that are not replicated (missing at the destination) get records too: they must not count.
    records += [{"topic": a, "partition": 3, "value": b"lost"}, {"topic": b, "partition": 0, "value": b"lost"}]
    produce(stack.source_bootstrap_servers, records)

    runner = TaskThread.start(store, u)
    wait_until(
        lambda: store.load_offsets(u) == {(a, 0): 110, (a, 1): 110, (c, 0): 10},
        timeout=90,
        what="every replicated record committed",
    )
    slack_ms = time.time_ns() // 1_000_000 - start_ms
    runner.finish()
    assert slack_ms < MINUTE, "the replication took too long for the records to stay inside their buckets"
    KafkaMonitor(store).poll(u)  # a later observation must not move "since"

    lake = tmp_path_factory.mktemp("lake")
    resources = {
        "platform": PlatformDatabase(database_url=db_engine.url.render_as_string(hide_password=False)),
        "reporting": Reporting(lake_dir=str(lake), p99_threshold_ms=5 * MINUTE),
        "pyspark": PySparkResource(spark_config=spark_config("local[2]")),
    }
    hours = sorted({hour_key(datetime.fromtimestamp(start_ms / 1000, UTC)), hour_key(datetime.now(UTC))})
    for hour in hours[:-1]:  # the run crossed an hour boundary: export the earlier hour too
        assert dg.materialize([platform_lake], partition_key=hour, resources=resources).success
    result = dg.materialize(
        [platform_lake, source_topics, destination_topics, *report_assets],
        partition_key=hours[-1],
        resources=resources,
        raise_on_error=True,
    )
    assert result.success
    yield Estate(u, a, b, c, ages_a, ages_c, slack_ms, expected_bytes, expected_records, (before, after), lake, result)
    store.delete_connector(u)


def test_latency_report_matches_the_known_source_timestamps(estate: Estate) -> None:
    rows = {r["destination_topic"]: r for r in _rows(report_path(estate.lake, "replication_latency"), estate.connector)}
    assert set(rows) == {f"{estate.topic_a}.mirror", f"{estate.topic_c}.mirror"}
    a, slack = rows[f"{estate.topic_a}.mirror"], estate.slack_ms
    ages = estate.ages_a
    assert a["count"] == len(ages) == 220
    assert min(ages) <= a["min_ms"] <= min(ages) + slack
    assert max(ages) <= a["max_ms"] <= max(ages) + slack
    assert sum(ages) / len(ages) <= a["avg_ms"] <= sum(ages) / len(ages) + slack
    # Mirus's cumulative buckets: every group is far from a bound, so the counts are exact.
    cumulative = {bound: sum(1 for age in ages if age <= bound) for bound in BOUNDS}
    assert (
        (a["le_5m"], a["le_10m"], a["le_30m"], a["le_60m"], a["le_12h"], a["more"])
        == (
            cumulative[300_000],
            cumulative[600_000],
            cumulative[1_800_000],
            cumulative[3_600_000],
            cumulative[43_200_000],
            len(ages) - cumulative[43_200_000],
        )
        == (100, 160, 190, 206, 218, 2)
    )
    # Percentiles: the interpolated estimate from the true bucket counts, and inside the true percentile's bucket.
    per_bucket = [cumulative[BOUNDS[0]]] + [cumulative[hi] - cumulative[lo] for lo, hi in pairwise(BOUNDS)]
    per_bucket.append(len(ages) - cumulative[BOUNDS[-1]])  # above the last bound
    for column, q in (("p50_ms", 0.5), ("p95_ms", 0.95), ("p99_ms", 0.99)):
        assert a[column] == pytest.approx(interpolated(q, per_bucket, (*BOUNDS, float("inf")))), column
        true_value = nearest_rank(ages, q)
        bucket = next(i for i, bound in enumerate(BOUNDS) if true_value <= bound)
        assert (BOUNDS[bucket - 1] if bucket else 0) < a[column] <= BOUNDS[bucket], column
    assert (a["p50_ms"], a["p95_ms"], a["p99_ms"]) == pytest.approx((350_000, 13_500_000, 42_540_000))

    c = rows[f"{estate.topic_c}.mirror"]
    assert c["count"] == 10 and c["le_5m"] == 10 and c["more"] == 0
    assert 2 * MINUTE <= c["min_ms"] <= c["p50_ms"] <= c["p99_ms"] <= c["max_ms"] <= 2 * MINUTE + slack


def test_latency_check_fails_above_the_threshold_and_names_the_topic(estate: Estate) -> None:
    (evaluation,) = [e for e in estate.result.get_asset_check_evaluations() if e.check_name == P99_CHECK]
    assert evaluation.asset_key == dg.AssetKey(LATENCY_REPORT_ASSET)
    assert not evaluation.passed  # p99 of topic a is ~12 h, the threshold 5 min
    late = [r.data["destination topic"] for r in evaluation.metadata["over threshold"].records]
    assert f"{estate.topic_a}.mirror" in late and f"{estate.topic_c}.mirror" not in late


def test_missing_partitions_report_names_reason_and_since(estate: Estate) -> None:
    rows = _rows(report_path(estate.lake, "missing_partitions"), estate.connector)
    found = {(r["source_topic"], r["partition"]): r for r in rows}
    assert set(found) == {(estate.topic_a, 2), (estate.topic_a, 3), (estate.topic_b, 0)}
    before, after = estate.first_poll
    for partition in (2, 3):
        row = found[(estate.topic_a, partition)]
        assert row["reason"] == "destination topic has fewer partitions"
        assert (row["destination_topic"], row["destination_partitions"]) == (f"{estate.topic_a}.mirror", 2)
        assert before - timedelta(seconds=1) <= row["since"] <= after + timedelta(seconds=1)
    missing = found[(estate.topic_b, 0)]
    assert missing["reason"] == "destination topic missing"
    assert missing["destination_topic"] == f"{estate.topic_b}.mirror" and missing["destination_partitions"] is None
    assert before - timedelta(seconds=1) <= missing["since"] <= after + timedelta(seconds=1)

    (evaluation,) = [e for e in estate.result.get_asset_check_evaluations() if e.check_name == MISSING_CHECK]
    assert evaluation.asset_key == dg.AssetKey(MISSING_REPORT_ASSET) and not evaluation.passed
    reasons = evaluation.metadata["reasons"].value
    assert (
        f"destination topic missing: {estate.topic_b}.mirror does not exist; excluded by destination checking"
        in reasons
    )


def test_throughput_and_lag_per_topic(estate: Estate, db_engine: Engine) -> None:
    rows = _rows(report_path(estate.lake, "throughput_lag"), estate.connector)
    totals: dict[str, list[int]] = {}
    for r in rows:
        total = totals.setdefault(r["topic"], [0, 0])
        total[0] += r["records"]
        total[1] += r["bytes"]
        assert r["records_per_s"] >= r["records"] / 300 and r["bytes_per_s"] >= r["bytes"] / 300
        assert r["records_per_s"] * r["bytes"] == pytest.approx(r["bytes_per_s"] * r["records"])
    by_topic: dict[str, list[int]] = {}
    for (topic, _), records in estate.records.items():
        by_topic.setdefault(topic, [0, 0])[0] += records
    for (topic, _), nbytes in estate.bytes.items():
        by_topic[topic][1] += nbytes
    assert {t: total for t, total in totals.items() if total[0]} == by_topic
    # Lag: the last value the task reported in each step (its partitions' lags summed), straight from Postgres.
    with db_engine.connect() as conn:
        samples = conn.execute(
            text("SELECT topic, interval_end, lag FROM metric_samples WHERE connector = :c"), {"c": estate.connector}
        ).all()
    for r in rows:
        within = r["time"], r["time"] + timedelta(minutes=5)
        step = [s for s in samples if s.topic == r["topic"] and within[0] <= s.interval_end < within[1]]
        assert r["lag"] == max(step, key=lambda s: s.interval_end).lag
    assert Store(db_engine).partition_lags(estate.connector) == {
        (estate.topic_a, 0): 0,
        (estate.topic_a, 1): 0,
        (estate.topic_c, 0): 0,
    }


def test_reports_read_hours_exported_per_partition_beside_hours_per_topic(
    spark: SparkSession, stack: StackEndpoints, db_engine: Engine, tmp_path: Path, unique: str
) -> None:
    """Hours exported before samples were per topic hold a row per partition: the reports read both together, and
    an old hour's lag is its partitions' lags summed."""
    old, new = datetime(2026, 11, 22, 6, tzinfo=UTC), datetime(2026, 11, 22, 7, tzinfo=UTC)
    base = {
        "connector": unique,
        "task_id": 0,
        "topic": "t",
        "destination_topic": "t.m",
        "latency_min_ms": 50,
        "latency_max_ms": 50,
        "latency_sum_ms": 0,
        "interval_start": old,
        "interval_end": old + timedelta(minutes=1),
        **dict.fromkeys(BUCKET_COLUMNS[:2], 0),
    }
    per_partition = [
        {
            **base,
            "id": 1,
            "partition": 0,
            "records": 3,
            "bytes": 30,
            "lag": 5,
            "latency_count": 3,
            **dict.fromkeys(BUCKET_COLUMNS[2:], 3),
        },
        {
            **base,
            "id": 2,
            "partition": 1,
            "records": 4,
            "bytes": 40,
            "lag": 7,
            "latency_count": 4,
            **dict.fromkeys(BUCKET_COLUMNS[2:], 4),
        },
    ]
    directory = hour_dir(tmp_path, "metric_samples", old)
    directory.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(per_partition, schema=SCHEMAS["metric_samples"]), directory / PART_FILE)
    store = Store(db_engine)
    props = connector_properties(stack, unique, **{"topics.whitelist": "t", "destination.topic.name.suffix": ".m"})
    store.put_connector(unique, props, 1)
    sample = replace(metric_row("t", new + timedelta(minutes=1), 5), lag=2)
    store.record_metrics(unique, MetricInterval([sample], {("t", 0): 1, ("t", 1): 1}, sample.interval_end))
    export_hour(db_engine, tmp_path, new, now=new + timedelta(hours=2))
    (exported,) = [
        r
        for r in pq.read_table(hour_dir(tmp_path, "metric_samples", new) / PART_FILE).to_pylist()
        if r["connector"] == unique
    ]
    assert exported["partition"] is None and exported["records"] == 5

    report = throughput_lag_report(spark, tmp_path, old, new + timedelta(hours=1), 3600)
    steps = [
        (r.time.replace(tzinfo=UTC), r.records, r.bytes, r.lag)
        for r in report.where(f"connector = '{unique}'").collect()
    ]
    assert steps == [(old, 7, 70, 12), (new, 5, 50, 2)]
    (latency,) = (
        latency_report(spark, tmp_path, old, new + timedelta(hours=1)).where(f"connector = '{unique}'").collect()
    )
    assert (latency.destination_topic, latency["count"], latency.le_5m) == ("t.m", 12, 12)


def test_report_materializations_carry_tables_and_charts(estate: Estate) -> None:
    materializations = {
        e.materialization.asset_key.to_user_string(): e.materialization.metadata
        for e in estate.result.get_asset_materialization_events()
    }
    latency = materializations[LATENCY_REPORT_ASSET]
    assert latency["latency over time"].value.startswith("![latency](data:image/png;base64,")
    headings = {c.name for c in latency["by destination topic (worst p99 first)"].schema.columns}
    assert {"p50", "p95", "p99", "≤5m", "≤12h", ">12h"} <= headings
    assert {"rows", "pruned metric_samples rows", "postgres metric_samples rows"} <= set(
        materializations["lake/metric_samples"]
    )
    assert materializations["throughput_lag_report"]["lag"].value.startswith("![lag](data:image/png;base64,")


def test_missing_since_starts_at_the_latest_unbroken_run(spark: SparkSession, tmp_path: Path) -> None:
    """Missing, fixed, missing again: "since" is when it went missing the second time; unrelated changes and failed
    observations do not move it."""
    t0 = datetime(2026, 11, 22, 6, 0, tzinfo=UTC)
    at = [t0 + timedelta(minutes=m) for m in (0, 10, 20, 30, 40)]
    observations = [  # (time, cluster, topics, error)
        (at[0], "source", {"t": 2}, None),
        (at[0], "destination", {"t.m": 1}, None),
        (at[1], "destination", {"t.m": 2}, None),  # fixed: the destination got its second partition
        (at[2], "destination", {"t.m": 1}, None),  # re-created with one partition: missing again
        (at[3], "source", {"t": 2, "unrelated": 3}, None),
        (at[4], "destination", {}, "destination cluster metadata unavailable"),
    ]
    rows = []
    for snapshot_id, (taken_at, cluster, topics, error) in enumerate(observations):
        base = {"snapshot_id": snapshot_id, "connector": "x", "cluster": cluster, "taken_at": taken_at, "error": error}
        rows += [{**base, "topic": t, "partitions": n} for t, n in topics.items()] or [{**base, "topic": None}]
    directory = hour_dir(tmp_path, "metadata_snapshots", t0)
    directory.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMAS["metadata_snapshots"]), directory / PART_FILE)
    state = {
        "connectors": [
            {
                "connector": "x",
                "state": "RUNNING",
                "version": 1,
                "tasks_max": 1,
                "enable_destination_topic_checking": True,
                "enable_partition_matching": True,
            }
        ],
        "connector_routes": [{"connector": "x", "source_topic": "t", "destination_topic": "t.m", "cycle": False}],
        "partition_status": [],
        "assignments": [],
    }
    for table, data in state.items():
        state_path(tmp_path, table).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(data, schema=SCHEMAS[table]), state_path(tmp_path, table))

    (row,) = [r.asDict() for r in missing_partitions_report(spark, tmp_path).collect()]
    assert (row["source_topic"], row["partition"], row["reason"]) == ("t", 1, "destination topic has fewer partitions")
    assert row["since"].replace(tzinfo=UTC) == at[2]
