"""The replication reports, computed by Spark over the lake (`reports/lake.py`): DataFrames in, DataFrames out.

- `latency_report`: per connector and destination topic over a window — count, min, max, avg, p50/p95/p99 and
  Mirus's cumulative buckets (<= 5m, 10m, 30m, 60m, 12h, more).
- `latency_over_time`: the estate's p50/p95/p99 per time step (for the chart).
- `missing_partitions_report`: every selected source partition that has no destination partition now, why, and
  since when.
- `throughput_lag_report`: per connector, source topic and time step: records/s, bytes/s and lag.

Percentiles come from the cumulative latency histogram, as Prometheus's `histogram_quantile` does: find the
bucket holding the rank and interpolate linearly inside it, with the bucket narrowed to the observed min and max.
The estimate always lies in the bucket that holds the true percentile; count, min, max, avg and bucket counts are
exact.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import reduce
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from replicator.engine.metrics import LATENCY_BUCKETS_MS, MIRUS_BUCKETS_MS
from reports.lake import BUCKET_COLUMNS, PART_GLOB, SCHEMAS, hourly_files, state_path

PERCENTILES = {"p50_ms": 0.5, "p95_ms": 0.95, "p99_ms": 0.99}
MIRUS_BUCKET_NAMES = {
    300_000: "le_5m",
    600_000: "le_10m",
    1_800_000: "le_30m",
    3_600_000: "le_60m",
    43_200_000: "le_12h",
}
REASON_TOPIC_MISSING = "destination topic missing"
REASON_FEWER_PARTITIONS = "destination topic has fewer partitions"
REASON_PAUSED = "paused by the task"
REASON_DROPPED = "dropped by the task"

_SPARK_TYPES = {pa.string(): "STRING", pa.int64(): "BIGINT", pa.int32(): "INT", pa.bool_(): "BOOLEAN"}


def _ddl(table: str) -> str:
    return ", ".join(
        f"`{f.name}` {'TIMESTAMP' if pa.types.is_timestamp(f.type) else _SPARK_TYPES[f.type]}" for f in SCHEMAS[table]
    )


def read_hourly(spark: SparkSession, lake: Path, table: str, start: datetime, end: datetime) -> DataFrame:
    """The hourly files of `table` overlapping [start, end) (an empty frame when there are none)."""
    files = hourly_files(lake, table, start, end)
    if not files:
        return spark.createDataFrame([], _ddl(table))
    return spark.read.schema(_ddl(table)).parquet(*(str(f) for f in files))


def read_all(spark: SparkSession, lake: Path, table: str) -> DataFrame:
    """Every hourly file of `table` (for small, change-only tables such as snapshots)."""
    files = sorted((lake / table).glob(f"hour=*/{PART_GLOB}"))
    if not files:
        return spark.createDataFrame([], _ddl(table))
    return spark.read.schema(_ddl(table)).parquet(*(str(f) for f in files))


def read_state(spark: SparkSession, lake: Path, table: str) -> DataFrame:
    path = state_path(lake, table)
    if not path.exists():
        return spark.createDataFrame([], _ddl(table))
    return spark.read.schema(_ddl(table)).parquet(str(path))


# -- latency --------------------------------------------------------------------------------------------------


def _percentile_sql(q: float) -> str:
    """SQL over aggregated columns (`count`, `min_ms`, `max_ms`, `le_*` cumulative sums) estimating quantile `q`."""
    rank = f"(CAST({q} AS DOUBLE) * `count`)"  # doubles throughout: decimal literals would make it DECIMAL
    bounds = [*LATENCY_BUCKETS_MS, None]
    branches = []
    for i, (column, upper) in enumerate(zip(BUCKET_COLUMNS, bounds, strict=True)):
        below = f"`{BUCKET_COLUMNS[i - 1]}`" if i else "0"
        lower = f"greatest({bounds[i - 1] if i else 0}, min_ms)"
        top = f"least({upper}, max_ms)" if upper is not None else "max_ms"
        estimate = f"{lower} + ({top} - {lower}) * ({rank} - {below}) / (`{column}` - {below})"
        branches.append(f"WHEN `{column}` >= {rank} THEN least(greatest({estimate}, min_ms), max_ms)")
    return f"CASE WHEN `count` = 0 THEN NULL {' '.join(branches)} END"


def _latency_aggregates(samples: DataFrame, *keys: str) -> DataFrame:
    summed = (
        samples.where("latency_count > 0")
        .groupBy(*keys)
        .agg(
            F.sum("latency_count").alias("count"),
            F.min("latency_min_ms").alias("min_ms"),
            F.max("latency_max_ms").alias("max_ms"),
            F.sum("latency_sum_ms").alias("sum_ms"),
            *(F.sum(c).alias(c) for c in BUCKET_COLUMNS),
        )
    )
    return summed.selectExpr(
        *keys,
        "`count`",
        "min_ms",
        "max_ms",
        "CAST(sum_ms AS DOUBLE) / `count` AS avg_ms",
        *(f"CAST({_percentile_sql(q)} AS DOUBLE) AS {name}" for name, q in PERCENTILES.items()),
        *(f"`le_{bound}` AS {MIRUS_BUCKET_NAMES[bound]}" for bound in MIRUS_BUCKETS_MS),
        f"`count` - `le_{MIRUS_BUCKETS_MS[-1]}` AS more",
    )


def latency_report(spark: SparkSession, lake: Path, start: datetime, end: datetime) -> DataFrame:
    samples = read_hourly(spark, lake, "metric_samples", start, end).where(
        (F.col("interval_end") >= F.lit(start)) & (F.col("interval_end") < F.lit(end))
    )
    return _latency_aggregates(samples, "connector", "destination_topic").orderBy("connector", "destination_topic")


def latency_over_time(spark: SparkSession, lake: Path, start: datetime, end: datetime, step_s: int) -> DataFrame:
    samples = read_hourly(spark, lake, "metric_samples", start, end).where(
        (F.col("interval_end") >= F.lit(start)) & (F.col("interval_end") < F.lit(end))
    )
    stepped = samples.withColumn("time", _step(step_s))
    return _latency_aggregates(stepped, "time").orderBy("time")


def _step(step_s: int) -> F.Column:
    return F.timestamp_seconds(F.floor(F.unix_seconds("interval_end") / step_s) * step_s)


# -- missing partitions ---------------------------------------------------------------------------------------


def missing_partitions_report(spark: SparkSession, lake: Path) -> DataFrame:
    """Selected source partitions without a destination partition at the latest snapshot, and since when.

    The monitor's rule (`replicator.discovery.monitor.plan_partitions`) is replayed over the snapshot history: with
    destination checking, a partition is excluded when its destination topic is missing, or (with partition
    matching) when the destination topic has fewer partitions. "Since" is the first snapshot of the unbroken run
    of snapshots in which it was missing for the same reason (snapshots are stored only when something changed, so
    the whole history is read). Partitions the task paused or dropped
    (`partition_status`) are listed with the task's reason and the time it was recorded.
    """
    snapshots = read_all(spark, lake, "metadata_snapshots").where("error IS NULL")
    connectors = read_state(spark, lake, "connectors").select(
        "connector", "enable_destination_topic_checking", "enable_partition_matching"
    )
    routes = read_state(spark, lake, "connector_routes").where("NOT cycle")
    events = snapshots.select("connector", "taken_at").distinct()
    timeline = _snapshot_timeline(snapshots, events)
    states = _partition_states(snapshots, timeline, routes, connectors)
    latest = timeline.groupBy("connector").agg(F.max("taken_at").alias("taken_at"))
    current = states.join(latest, ["connector", "taken_at"]).where("reason IS NOT NULL")
    from_metadata = current.join(_missing_since(current, states, events), ["connector", "topic", "partition"]).select(
        "connector",
        F.col("topic").alias("source_topic"),
        "partition",
        "destination_topic",
        "destination_partitions",
        "reason",
        F.when(
            F.col("reason") == REASON_TOPIC_MISSING,
            F.format_string("%s does not exist; excluded by destination checking", "destination_topic"),
        )
        .otherwise(
            F.format_string(
                "%s has %d partitions (partition matching is on); excluded by destination checking",
                "destination_topic",
                "destination_partitions",
            )
        )
        .alias("detail"),
        "since",
    )
    from_tasks = _held_by_tasks(spark, lake, routes, connectors, from_metadata)
    return from_metadata.unionByName(from_tasks).orderBy("connector", "source_topic", "partition")


def _snapshot_timeline(snapshots: DataFrame, events: DataFrame) -> DataFrame:
    """At every event time of a connector, the latest good snapshot of each of its clusters (an as-of join)."""
    ids = snapshots.select("connector", "cluster", "taken_at", "snapshot_id").distinct()
    timeline = events
    for cluster in ("source", "destination"):
        mine = ids.where(F.col("cluster") == cluster).select(
            "connector", "taken_at", F.col("snapshot_id").alias(f"{cluster}_id")
        )
        timeline = timeline.join(mine, ["connector", "taken_at"], "left")
    ordered = "PARTITION BY connector ORDER BY taken_at ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"
    return timeline.selectExpr(
        "connector",
        "taken_at",
        f"last(source_id, true) OVER ({ordered}) AS source_id",
        f"last(destination_id, true) OVER ({ordered}) AS destination_id",
    )


def _partition_states(snapshots: DataFrame, timeline: DataFrame, routes: DataFrame, connectors: DataFrame) -> DataFrame:
    """Every selected source partition at every event time, with why it was excluded then (NULL: it was not)."""
    topic_rows = snapshots.select("snapshot_id", "topic", "partitions")
    source = (
        timeline.join(topic_rows.withColumnRenamed("snapshot_id", "source_id"), "source_id")
        .join(routes.withColumnRenamed("source_topic", "topic"), ["connector", "topic"])
        .withColumn("partition", F.explode(F.sequence(F.lit(0), F.col("partitions") - 1)))
        .drop("partitions")
    )
    destination = topic_rows.select(
        F.col("snapshot_id").alias("destination_id"),
        F.col("topic").alias("destination_topic"),
        F.col("partitions").alias("destination_partitions"),
    )
    return (
        source.join(destination, ["destination_id", "destination_topic"], "left")
        .join(connectors, "connector")
        .withColumn(
            "reason",
            F.when(~F.col("enable_destination_topic_checking"), None)
            .when(F.col("destination_partitions").isNull(), F.lit(REASON_TOPIC_MISSING))
            .when(
                F.coalesce(F.col("enable_partition_matching"), F.lit(False))
                & (F.col("partition") >= F.col("destination_partitions")),
                F.lit(REASON_FEWER_PARTITIONS),
            ),
        )
        .select("connector", "taken_at", "topic", "partition", "destination_topic", "destination_partitions", "reason")
    )


def _missing_since(current: DataFrame, states: DataFrame, events: DataFrame) -> DataFrame:
    """For each partition missing now, the first event of its unbroken run of events missing for the same reason."""
    # The last event before now at which the partition was absent or in another state ends the earlier run.
    history = (
        current.select("connector", "topic", "partition", F.col("reason").alias("current_reason"))
        .join(events, "connector")
        .join(
            states.select("connector", "taken_at", "topic", "partition", "reason"),
            ["connector", "taken_at", "topic", "partition"],
            "left",
        )
    )
    since = history.groupBy("connector", "topic", "partition").agg(
        F.max(F.when(~F.col("reason").eqNullSafe(F.col("current_reason")), F.col("taken_at"))).alias("broken_at")
    )
    return (
        history.join(since, ["connector", "topic", "partition"])
        .where(F.col("broken_at").isNull() | (F.col("taken_at") > F.col("broken_at")))
        .groupBy("connector", "topic", "partition")
        .agg(F.min("taken_at").alias("since"))
    )


def _held_by_tasks(
    spark: SparkSession, lake: Path, routes: DataFrame, connectors: DataFrame, from_metadata: DataFrame
) -> DataFrame:
    """Partitions a task paused or dropped (`partition_status`), unless the metadata already explains them."""
    return (
        read_state(spark, lake, "partition_status")
        .where("state IN ('PAUSED', 'DROPPED')")
        # Only selected source topics: the task's own flows (e.g. heartbeats) are not source partitions.
        .join(routes.withColumnRenamed("source_topic", "topic"), ["connector", "topic"])
        .join(
            from_metadata.select("connector", F.col("source_topic").alias("topic"), "partition"),
            ["connector", "topic", "partition"],
            "left_anti",
        )
        .join(connectors.select("connector"), "connector")
        .select(
            "connector",
            F.col("topic").alias("source_topic"),
            "partition",
            "destination_topic",
            F.lit(None).cast("int").alias("destination_partitions"),
            F.when(F.col("state") == "PAUSED", F.lit(REASON_PAUSED)).otherwise(F.lit(REASON_DROPPED)).alias("reason"),
            F.col("reason").alias("detail"),
            F.col("updated_at").alias("since"),
        )
    )


# -- throughput and lag ---------------------------------------------------------------------------------------


def throughput_lag_report(spark: SparkSession, lake: Path, start: datetime, end: datetime, step_s: int) -> DataFrame:
    """Per connector, source topic and time step: records, bytes, their rates, and the lag.

    Rates divide by the step's length (the last, unfinished step by the time elapsed in it). `lag` is the topic's:
    the last value each task reported in the step, summed over the tasks (and, in hours exported when samples were
    per partition, over the partitions); `max_lag` sums their highest. Null when no broker gave a usable high
    watermark. Each partition's latest lag is in Postgres (`partition_lags`), not in the lake.
    """
    samples = read_hourly(spark, lake, "metric_samples", start, end).where(
        (F.col("interval_end") >= F.lit(start)) & (F.col("interval_end") < F.lit(end))
    )
    per_writer = (
        samples.withColumn("time", _step(step_s))
        .groupBy("connector", "topic", "task_id", "partition", "time")
        .agg(
            F.sum("records").alias("records"),
            F.sum("bytes").alias("bytes"),
            F.max_by("lag", "interval_end").alias("lag"),
            F.max("lag").alias("max_lag"),
        )
    )
    per_step = per_writer.groupBy("connector", "topic", "time").agg(
        *(F.sum(c).alias(c) for c in ("records", "bytes", "lag", "max_lag"))
    )
    seconds = F.least(F.lit(float(step_s)), F.unix_seconds(F.lit(end)) - F.unix_seconds("time"))
    return per_step.select(
        "connector",
        "topic",
        "time",
        "records",
        "bytes",
        (F.col("records") / seconds).alias("records_per_s"),
        (F.col("bytes") / seconds).alias("bytes_per_s"),
        "lag",
        "max_lag",
    ).orderBy("connector", "topic", "time")


@dataclass(frozen=True)
class ThroughputSummary:
    """What the throughput report shows at a glance, computed from its table."""

    topics: list[dict[str, Any]]  # per source topic: latest lag and rate, max lag; most lagging first
    records_per_s_last_hour: float
    rate_series: dict[str, list[tuple[datetime, float]]]  # connector -> (step, records/s)
    lag_series: dict[str, list[tuple[datetime, float]]]  # "connector topic" -> (step, lag)


def throughput_summary(report: DataFrame, end: datetime, lagging: int = 8) -> ThroughputSummary:
    """Per-topic latest values, the last hour's rate, records/s per connector and the `lagging` worst lags."""
    topics = [
        r.asDict()
        for r in report.groupBy("connector", "topic")
        .agg(
            F.max_by("lag", "time").alias("lag"),
            F.max("max_lag").alias("max_lag"),
            F.max_by("records_per_s", "time").alias("records_per_s"),
            F.max("time").alias("time"),
        )
        .orderBy(F.col("max_lag").desc_nulls_last(), "connector", "topic")
        .collect()
    ]
    total = report.where(F.col("time") >= F.lit(end - timedelta(hours=1))).agg(F.sum("records")).first()
    assert total is not None  # an aggregate over the whole frame is one row, null if it has none
    last_hour = total[0]
    rates: dict[str, list[tuple[datetime, float]]] = defaultdict(list)
    for r in report.groupBy("connector", "time").agg(F.sum("records_per_s").alias("rate")).orderBy("time").collect():
        rates[r.connector].append((r.time, float(r.rate)))
    worst = [(t["connector"], t["topic"]) for t in topics[:lagging] if t["max_lag"] is not None]
    lags: dict[str, list[tuple[datetime, float]]] = defaultdict(list)
    if worst:
        keys = [(F.col("connector") == c) & (F.col("topic") == t) for c, t in worst]
        for r in report.where(reduce(operator.or_, keys) & F.col("lag").isNotNull()).orderBy("time").collect():
            lags[f"{r.connector} {r.topic}"].append((r.time, float(r.lag)))
    return ThroughputSummary(topics, float(last_hour or 0) / 3600, dict(rates), dict(lags))
