"""The Spark reports as assets: each writes its full table to the lake and shows a summary, charts and a check."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg

from assets.lake import METRIC_SAMPLES_LAKE, SNAPSHOTS_LAKE, STATE_LAKE
from assets.topology import DESTINATION_TOPICS
from mirus_dagster.constants import (
    LATENCY_REPORT_ASSET,
    MISSING_CHECK,
    MISSING_REPORT_ASSET,
    P99_CHECK,
    REPORTS_GROUP,
    THROUGHPUT_REPORT_ASSET,
)
from mirus_dagster.reporting import Reporting, SparkResource

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# The report modules (Spark's SQL functions, Arrow, matplotlib) are imported by the report functions, not
# here: every run process of the platform loads this code location, replicator and worker runs included.

LATENCY_REPORT = dg.AssetKey(LATENCY_REPORT_ASSET)
MISSING_REPORT = dg.AssetKey(MISSING_REPORT_ASSET)
THROUGHPUT_REPORT = dg.AssetKey(THROUGHPUT_REPORT_ASSET)
TABLE_ROWS = 50  # rows shown in the UI; the lake holds the full table


def report_path(lake: Path, name: str) -> Path:
    return lake / "reports" / name


def _save(spark: SparkSession, frame: DataFrame, lake: Path, name: str) -> list[dict[str, Any]]:
    """Write the report to the lake (replacing the previous one) and read it back for the summary."""
    path = str(report_path(lake, name))
    frame.coalesce(1).write.mode("overwrite").parquet(path)
    return [row.asDict() for row in spark.read.parquet(path).collect()]


def _window(reporting: Reporting) -> tuple[datetime, datetime]:
    end = datetime.now(UTC)
    return end - timedelta(hours=reporting.window_hours), end


def _table(rows: Sequence[Mapping[str, Any]], columns: Mapping[str, str]) -> dg.MetadataValue:
    """A UI table of `rows` with `columns` (field -> heading); durations in `*_ms` fields shown readably."""

    def shown(field: str, value: Any) -> Any:
        if value is None:
            return "—"
        if field.endswith("_ms"):
            from reports.charts import duration_label

            return duration_label(float(value))
        if isinstance(value, float):
            return round(value, 2)
        if isinstance(value, datetime):
            return f"{value:%Y-%m-%d %H:%M:%S} UTC"
        return value

    records = [dg.TableRecord({heading: shown(f, r.get(f)) for f, heading in columns.items()}) for r in rows]
    schema = dg.TableSchema(columns=[dg.TableColumn(heading, "string") for heading in columns.values()])
    return dg.MetadataValue.table(records, schema)


_LATENCY_COLUMNS = {
    "connector": "connector",
    "destination_topic": "destination topic",
    "count": "records",
    "min_ms": "min",
    "avg_ms": "avg",
    "p50_ms": "p50",
    "p95_ms": "p95",
    "p99_ms": "p99",
    "max_ms": "max",
    "le_5m": "≤5m",
    "le_10m": "≤10m",
    "le_30m": "≤30m",
    "le_60m": "≤60m",
    "le_12h": "≤12h",
    "more": ">12h",
}


@dg.asset(
    key=LATENCY_REPORT,
    group_name=REPORTS_GROUP,
    deps=[METRIC_SAMPLES_LAKE, DESTINATION_TOPICS],
    check_specs=[
        dg.AssetCheckSpec(
            P99_CHECK,
            asset=LATENCY_REPORT,
            description="Fails when a destination topic's p99 latency passes the threshold.",
        )
    ],
    description="Replication latency per connector and destination topic over the report window: count, min, "
    "avg, p50/p95/p99, max and Mirus's cumulative buckets.",
)
def replication_latency_report(pyspark: SparkResource, reporting: Reporting) -> dg.MaterializeResult:
    from reports import charts
    from reports.replication import latency_over_time, latency_report

    spark, lake = pyspark.spark_session, reporting.lake
    start, end = _window(reporting)
    rows = _save(spark, latency_report(spark, lake, start, end), lake, "replication_latency")
    rows.sort(key=lambda r: -(r["p99_ms"] or 0))
    steps = [r.asDict() for r in latency_over_time(spark, lake, start, end, reporting.step_minutes * 60).collect()]
    late = [r for r in rows if (r["p99_ms"] or 0) > reporting.p99_threshold_ms]
    threshold = charts.duration_label(reporting.p99_threshold_ms)
    return dg.MaterializeResult(
        metadata={
            "window": f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC",
            "destination topics": len(rows),
            "records": sum(r["count"] for r in rows),
            "worst p99 (ms)": round(rows[0]["p99_ms"]) if rows else 0,
            "latency over time": dg.MetadataValue.md(charts.markdown_image("latency", charts.latency_chart(steps))),
            "by destination topic (worst p99 first)": _table(rows[:TABLE_ROWS], _LATENCY_COLUMNS),
            "full table": dg.MetadataValue.path(str(report_path(lake, "replication_latency"))),
        },
        check_results=[
            dg.AssetCheckResult(
                check_name=P99_CHECK,
                passed=not late,
                description=f"{len(late)} destination topic(s) with p99 above {threshold}"
                if late
                else f"every destination topic's p99 is within {threshold}",
                metadata={
                    "threshold": threshold,
                    "worst p99 (ms)": round(rows[0]["p99_ms"]) if rows else 0,
                    "over threshold": _table(late[:TABLE_ROWS], _LATENCY_COLUMNS),
                },
            )
        ],
    )


_MISSING_COLUMNS = {
    "connector": "connector",
    "source_topic": "source topic",
    "partition": "partition",
    "destination_topic": "destination topic",
    "reason": "reason",
    "since": "since",
    "detail": "detail",
}


@dg.asset(
    key=MISSING_REPORT,
    group_name=REPORTS_GROUP,
    deps=[SNAPSHOTS_LAKE, STATE_LAKE, DESTINATION_TOPICS],
    check_specs=[
        dg.AssetCheckSpec(
            MISSING_CHECK,
            asset=MISSING_REPORT,
            description="Fails when a selected source partition has no destination partition.",
        )
    ],
    description="Every selected source partition without a destination partition: why, and since when.",
)
def missing_partitions(pyspark: SparkResource, reporting: Reporting) -> dg.MaterializeResult:
    from reports import charts
    from reports.replication import missing_partitions_report

    spark, lake = pyspark.spark_session, reporting.lake
    rows = _save(spark, missing_partitions_report(spark, lake), lake, "missing_partitions")
    rows.sort(key=lambda r: (r["connector"], r["source_topic"], r["partition"]))
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in rows:
        counts[r["connector"]][r["reason"]] += 1
    return dg.MaterializeResult(
        metadata={
            "missing partitions": len(rows),
            "per connector": dg.MetadataValue.md(charts.markdown_image("missing", charts.missing_chart(counts))),
            "partitions": _table(rows[:TABLE_ROWS], _MISSING_COLUMNS),
            "full table": dg.MetadataValue.path(str(report_path(lake, "missing_partitions"))),
        },
        check_results=[
            dg.AssetCheckResult(
                check_name=MISSING_CHECK,
                passed=not rows,
                description=f"{len(rows)} source partition(s) have no destination partition"
                if rows
                else "every selected source partition has a destination partition",
                metadata={
                    "missing": _table(rows[:TABLE_ROWS], _MISSING_COLUMNS),
                    "reasons": dg.MetadataValue.json(sorted({f"{r['reason']}: {r['detail']}" for r in rows})),
                },
            )
        ],
    )


_LAG_COLUMNS = {
    "connector": "connector",
    "topic": "source topic",
    "lag": "lag now",
    "max_lag": "max lag",
    "records_per_s": "records/s (last step)",
    "time": "last step",
}
CHART_TOPICS = 8


@dg.asset(
    key=THROUGHPUT_REPORT,
    group_name=REPORTS_GROUP,
    deps=[METRIC_SAMPLES_LAKE, DESTINATION_TOPICS],
    description="Records/s, bytes/s and lag per connector and source topic, per time step over the window.",
)
def throughput_lag(pyspark: SparkResource, reporting: Reporting) -> dg.MaterializeResult:
    from reports import charts
    from reports.replication import throughput_lag_report, throughput_summary

    spark, lake = pyspark.spark_session, reporting.lake
    start, end = _window(reporting)
    step_s = reporting.step_minutes * 60
    path = str(report_path(lake, "throughput_lag"))
    throughput_lag_report(spark, lake, start, end, step_s).write.mode("overwrite").parquet(path)
    summary = throughput_summary(spark.read.parquet(path), end, CHART_TOPICS)
    rate_chart = charts.series_chart(
        "Records replicated per second, per connector (UTC)", summary.rate_series, "records/s", "no records"
    )
    no_lag = "no lag reported (the broker's high watermarks were unusable, or nothing lags)"
    lag_chart = charts.series_chart("Lag of the most lagging topics (UTC)", summary.lag_series, "records", no_lag)
    return dg.MaterializeResult(
        metadata={
            "window": f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC, step {reporting.step_minutes} min",
            "topics": len(summary.topics),
            "records/s over the last hour": round(summary.records_per_s_last_hour, 1),
            "topics with lag now": sum(1 for t in summary.topics if t["lag"]),
            "throughput": dg.MetadataValue.md(charts.markdown_image("throughput", rate_chart)),
            "lag": dg.MetadataValue.md(charts.markdown_image("lag", lag_chart)),
            "topics by max lag": _table(summary.topics[:TABLE_ROWS], _LAG_COLUMNS),
            "full table": dg.MetadataValue.path(path),
        }
    )


report_assets = [replication_latency_report, missing_partitions, throughput_lag]
