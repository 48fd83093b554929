"""Report runtime on a large lake: N metric samples (default 10 million) in the lake's hourly layout, then each
Spark report timed on a local session.

    python benchmarks/report_runtime.py [--samples 10000000] [--partitions 10000] [--master 'local[*]'] [--dir DIR]

The samples look like an estate of `--partitions` source partitions (10 connectors, 10 partitions a topic) each
writing one sample every 10 s; latencies follow a fixed profile with some partitions far behind. Generation and
Spark start-up are timed separately from the reports.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import common  # noqa: F401  (this checkout's code first on the path)
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from mirus_dagster.reporting import spark_config
from replicator.engine.metrics import LATENCY_BUCKETS_MS
from reports.lake import (
    BUCKET_COLUMNS,
    HOUR,
    MANIFEST_FILE,
    PART_FILE,
    SCHEMAS,
    hour_dir,
    hour_floor,
    state_path,
)
from reports.replication import latency_over_time, latency_report, missing_partitions_report, throughput_lag_report

INTERVAL_S = 10
CONNECTORS = 10
PARTITIONS_PER_TOPIC = 10


def _cdf_profiles() -> np.ndarray:
    """Cumulative fraction of records at or below each bound, for a healthy, a slow and a far-behind partition."""
    bounds = np.array([*LATENCY_BUCKETS_MS, np.inf], dtype=float)
    profiles = []
    for median_ms in (40.0, 4_000.0, 2_000_000.0):
        profiles.append(1.0 - np.exp(-np.log(2) * bounds / median_ms))
    out = np.array(profiles)
    out[:, -1] = 1.0
    return out


def generate(lake: Path, samples: int, partitions: int, end: datetime) -> tuple[datetime, datetime]:
    rng = np.random.default_rng(7)
    intervals = -(-samples // partitions)
    start = end - timedelta(seconds=intervals * INTERVAL_S)
    per_connector = partitions // CONNECTORS
    connector = np.array([f"c{p // per_connector:02d}" for p in range(partitions)])
    topic = np.array([f"topic-{p // PARTITIONS_PER_TOPIC:05d}" for p in range(partitions)])
    partition = (np.arange(partitions) % PARTITIONS_PER_TOPIC).astype(np.int32)
    destination = np.char.add(topic, ".mirror")
    profile = rng.choice(3, size=partitions, p=[0.9, 0.09, 0.01])
    cdf = _cdf_profiles()[profile]
    schema = SCHEMAS["metric_samples"]
    writers: dict[datetime, pq.ParquetWriter] = {}
    written = 0
    for i in range(intervals):
        interval_end = start + timedelta(seconds=(i + 1) * INTERVAL_S)
        n = min(partitions, samples - written)
        records = rng.poisson(500, size=n).astype(np.int64)
        cumulative = np.floor(records[:, None] * cdf[:n]).astype(np.int64)
        cumulative[:, -1] = records
        lag = np.where(profile[:n] == 2, rng.integers(10_000, 100_000, size=n), rng.integers(0, 50, size=n))
        columns = {
            "id": np.arange(written + 1, written + n + 1, dtype=np.int64),
            "connector": connector[:n],
            "task_id": np.zeros(n, np.int32),
            "topic": topic[:n],
            "partition": partition[:n],
            "destination_topic": destination[:n],
            "interval_start": pa.array([interval_end - timedelta(seconds=INTERVAL_S)] * n, pa.timestamp("us", "UTC")),
            "interval_end": pa.array([interval_end] * n, pa.timestamp("us", "UTC")),
            "records": records,
            "bytes": records * 200,
            "latency_min_ms": np.full(n, 5, np.int64),
            "latency_max_ms": np.where(profile[:n] == 2, 9_000_000, 60_000).astype(np.int64),
            "latency_sum_ms": records * np.array([40, 4_000, 2_000_000])[profile[:n]],
            "latency_count": records,
            "lag": lag.astype(np.int64),
            **{column: cumulative[:, j] for j, column in enumerate(BUCKET_COLUMNS)},
        }
        hour = hour_floor(interval_end - timedelta(microseconds=1))
        if hour not in writers:
            hour_dir(lake, "metric_samples", hour).mkdir(parents=True, exist_ok=True)
            writers[hour] = pq.ParquetWriter(hour_dir(lake, "metric_samples", hour) / PART_FILE, schema)
        writers[hour].write_table(pa.table(columns, schema=schema))
        written += n
    for hour, writer in writers.items():
        writer.close()
        (hour_dir(lake, "metric_samples", hour) / MANIFEST_FILE).write_text(
            json.dumps({"rows": samples, "max_id": samples, "full_export_at": end.isoformat()})
        )
    _snapshots_and_state(lake, partitions, start)
    return start, end


def _snapshots_and_state(lake: Path, partitions: int, at: datetime) -> None:
    """Every topic on both clusters; one destination topic per connector has fewer partitions."""
    topics = partitions // PARTITIONS_PER_TOPIC
    per_connector = topics // CONNECTORS
    snapshots, routes, connectors = [], [], []
    for c in range(CONNECTORS):
        name = f"c{c:02d}"
        mine = [f"topic-{t:05d}" for t in range(c * per_connector, (c + 1) * per_connector)]
        for cluster, snapshot_id in (("source", 2 * c), ("destination", 2 * c + 1)):
            for i, t in enumerate(mine):
                count = PARTITIONS_PER_TOPIC if cluster == "source" or i else PARTITIONS_PER_TOPIC // 2
                snapshots.append(
                    {
                        "snapshot_id": snapshot_id,
                        "connector": name,
                        "cluster": cluster,
                        "taken_at": at,
                        "error": None,
                        "topic": t if cluster == "source" else f"{t}.mirror",
                        "partitions": count,
                    }
                )
        routes += [
            {"connector": name, "source_topic": t, "destination_topic": f"{t}.mirror", "cycle": False} for t in mine
        ]
        connectors.append(
            {
                "connector": name,
                "state": "RUNNING",
                "version": 1,
                "tasks_max": 8,
                "source_cluster_alias": "s",
                "target_cluster_alias": "t",
                "enable_destination_topic_checking": True,
                "enable_partition_matching": True,
                "config_error": None,
                "config": "{}",
            }
        )
    directory = hour_dir(lake, "metadata_snapshots", at)
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(snapshots, schema=SCHEMAS["metadata_snapshots"]), directory / PART_FILE)
    for table, rows in (
        ("connectors", connectors),
        ("connector_routes", routes),
        ("assignments", []),
        ("partition_status", []),
    ):
        state_path(lake, table).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMAS[table]), state_path(lake, table))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=10_000_000)
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--dir", type=Path, default=None, help="Reuse/keep the generated lake here.")
    args = parser.parse_args()
    lake = args.dir or Path(tempfile.mkdtemp(prefix="mirus-lake-"))
    end = hour_floor(datetime.now(UTC)) + HOUR
    try:
        t0 = time.monotonic()
        start, end = generate(lake, args.samples, args.partitions, end)
        size = sum(f.stat().st_size for f in lake.rglob("*.parquet"))
        print(f"generated {args.samples:,} samples ({size / 1e6:.0f} MB Parquet) in {time.monotonic() - t0:.1f}s")
        t0 = time.monotonic()
        spark = SparkSession.builder.config(map=spark_config(args.master)).getOrCreate()
        print(f"spark session ({args.master}) in {time.monotonic() - t0:.1f}s")
        out = lake / "reports"
        for name, build in (
            ("latency", lambda: latency_report(spark, lake, start, end)),
            ("latency over time", lambda: latency_over_time(spark, lake, start, end, 300)),
            ("missing partitions", lambda: missing_partitions_report(spark, lake)),
            ("throughput and lag", lambda: throughput_lag_report(spark, lake, start, end, 300)),
        ):
            t0 = time.monotonic()
            build().write.mode("overwrite").parquet(str(out / name.replace(" ", "_")))
            rows = spark.read.parquet(str(out / name.replace(" ", "_"))).count()
            print(f"{name:>20}: {time.monotonic() - t0:6.1f}s  ({rows:,} rows out)")
        spark.stop()
    finally:
        if args.dir is None:
            shutil.rmtree(lake, ignore_errors=True)


if __name__ == "__main__":
    main()
