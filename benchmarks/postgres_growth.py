"""Postgres growth from metric samples at 10,000 partitions, before and after retention (export, then prune).

    python benchmarks/postgres_growth.py [--partitions 10000] [--hours 6] [--every-s 600] [--retention-hours 3]

Writes samples through `Store.record_metrics` exactly as running tasks do (one row per source topic and interval,
topics of 10 partitions, each partition's lag overwritten), for `--partitions` partitions over the last `--hours`,
one interval every `--every-s` seconds of that span (a sample of the real 10 s cadence, to keep the run short),
measures rows and bytes per row, exports every hour to a temporary lake and prunes with the retention. Prints the
measured figures and the per-day arithmetic for the engine's real cadence (`metrics_interval_s`, 10 s). Uses
`MIRUS_DATABASE_URL` when set, else a private embedded Postgres on free ports.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import common
from sqlalchemy import Engine, text

from replicator.engine.metrics import TopicCounters
from replicator.state.database import upgrade
from replicator.state.records import MetricInterval, MetricRow
from replicator.state.store import Store
from reports.lake import HOUR, export_hour, hour_floor, prune

ENGINE_INTERVAL_S = 10  # ReplicationTask's default metrics interval
TASK_PARTITIONS = 100  # partitions per simulated task (one write per task and interval, as tasks do)
TOPIC_PARTITIONS = 10


def _table_bytes(engine: Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        conn.execute(text("ANALYZE metric_samples"))
        rows = conn.execute(text("SELECT count(*) FROM metric_samples")).scalar_one()
        size = conn.execute(text("SELECT pg_total_relation_size('metric_samples')")).scalar_one()
    return rows, size


def run(engine: Engine, partitions: int, hours: int, every_s: int, retention_hours: float) -> None:
    upgrade(engine)
    store = Store(engine)
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE metric_samples"))
    now = datetime.now(UTC)
    counters = TopicCounters()
    counters.add_latencies(2_000, [1_997, 1_992, 1_960, 1_880, 1_100, 0])  # a realistic, fully populated histogram
    histogram = counters.cumulative_histogram()
    started = time.monotonic()
    ends = [now - timedelta(seconds=s) for s in range(0, hours * 3600, every_s)]
    for end in ends:
        for task in range(partitions // TASK_PARTITIONS):
            topics = [
                f"topic-{(task * TASK_PARTITIONS + p) // TOPIC_PARTITIONS:05d}"
                for p in range(0, TASK_PARTITIONS, TOPIC_PARTITIONS)
            ]
            samples = [
                MetricRow(
                    task_id=task,
                    topic=topic,
                    interval_start=end - timedelta(seconds=ENGINE_INTERVAL_S),
                    interval_end=end,
                    records=6 * TOPIC_PARTITIONS,
                    bytes=6_000 * TOPIC_PARTITIONS,
                    latency_min_ms=3,
                    latency_max_ms=2_000,
                    latency_sum_ms=3_071 * TOPIC_PARTITIONS,
                    latency_count=6 * TOPIC_PARTITIONS,
                    latency_histogram=histogram,
                    lag=12 * TOPIC_PARTITIONS,
                )
                for topic in topics
            ]
            lags = {(topic, p): 12 for topic in topics for p in range(TOPIC_PARTITIONS)}
            store.record_metrics(f"c{task // 10:02d}", MetricInterval(samples, lags, end))
    written = time.monotonic() - started
    rows, size = _table_bytes(engine)
    per_row = size / rows
    topics = partitions // TOPIC_PARTITIONS
    print(
        f"wrote {rows:,} rows ({topics:,} topics of {partitions:,} partitions x {len(ends)} intervals) in "
        f"{written:.1f}s ({rows / written:,.0f} rows/s); table + indexes {size / 1e6:.0f} MB = "
        f"{per_row:.0f} bytes/row"
    )
    day_rows = topics * 86_400 // ENGINE_INTERVAL_S
    kept_rows = int(topics * retention_hours * 3600 / ENGINE_INTERVAL_S)
    print(
        f"per day at {topics:,} topics, one sample per {ENGINE_INTERVAL_S}s: {day_rows:,} rows, "
        f"{day_rows * per_row / 1e9:.1f} GB without retention"
    )
    print(
        f"with retention {retention_hours:g}h: at most {kept_rows:,} rows ({kept_rows * per_row / 1e9:.1f} GB) "
        "plus the hour being exported"
    )

    lake = Path(tempfile.mkdtemp(prefix="mirus-growth-lake-"))
    started = time.monotonic()
    hour = hour_floor(ends[-1])
    exported = 0
    while hour <= now:
        exported += export_hour(engine, lake, hour, now=now + timedelta(hours=2)).rows["metric_samples"]
        hour += HOUR
    export_s = time.monotonic() - started
    print(f"exported {exported:,} rows to Parquet in {export_s:.1f}s ({exported / export_s:,.0f} rows/s)")
    started = time.monotonic()
    result = prune(engine, lake, timedelta(hours=retention_hours), now=now)
    prune_s = time.monotonic() - started
    rows_after, size_after = _table_bytes(engine)
    print(
        f"pruned {result.metric_samples_deleted:,} rows in {prune_s:.1f}s; {rows_after:,} rows remain "
        f"(table {size_after / 1e6:.0f} MB until autovacuum reuses the space)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--hours", type=int, default=6)
    parser.add_argument("--every-s", type=int, default=600)
    parser.add_argument("--retention-hours", type=float, default=3.0)
    args = parser.parse_args()
    with common.platform_database() as store:
        run(store.engine, args.partitions, args.hours, args.every_s, args.retention_hours)


if __name__ == "__main__":
    main()
