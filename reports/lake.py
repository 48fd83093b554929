"""The platform's analytical store: its own Postgres records as hourly Parquet files that Spark reads offline.

Layout under the lake directory (`MIRUS_LAKE_DIR`):

    metric_samples/hour=2026-11-22T06/part-*.parquet      per task and source topic, by the hour of `interval_end`
    metadata_snapshots/hour=2026-11-22T06/part-0.parquet  one row per snapshot and topic, by the hour of `taken_at`
    <table>/hour=.../_export.json                         rows written and when
    state/{connectors,connector_routes,assignments,partition_status}.parquet   current state, replaced each export

Exporting an hour that has ended replaces that hour's files, so re-running or backfilling it never duplicates
rows. The hour still running is exported incrementally: each run appends a file with the samples written since the
previous run (by id), so refreshing it every few minutes costs what was written since, not the whole hour. An
hour is *sealed* when it was exported in full at least `SEAL_GRACE` after it ended (no task writes into it any
more); `prune` deletes Postgres rows older than the retention only in sealed hours, so nothing leaves Postgres
before it is in the lake.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import Engine

from replicator.configuration.connector import ConnectorConfig, ConnectorConfigError, load
from replicator.configuration.masking import mask_properties
from replicator.engine.metrics import BUCKET_LABELS, LATENCY_BUCKETS_MS
from replicator.state.records import ConnectorRecord
from replicator.state.store import Store

HOUR = timedelta(hours=1)
SEAL_GRACE = timedelta(minutes=5)
PART_FILE = "part-0.parquet"  # an hour exported in full; increments are part-<first id>.parquet
PART_GLOB = "part-*.parquet"
MANIFEST_FILE = "_export.json"
STATE_TABLES = ("connectors", "connector_routes", "assignments", "partition_status")
_FETCH_ROWS = 50_000

TIMESTAMP = pa.timestamp("us", tz="UTC")
BUCKET_COLUMNS: tuple[str, ...] = (*(f"le_{b}" for b in LATENCY_BUCKETS_MS), "le_inf")


def _schema(columns: list[tuple[str, pa.DataType]]) -> pa.Schema:
    """A table's schema from its (column, type) pairs (`pa.schema`'s overloads leave a literal's pairs untyped)."""
    return pa.schema(columns)


SCHEMAS: dict[str, pa.Schema] = {
    "metric_samples": _schema(
        [
            ("id", pa.int64()),
            ("connector", pa.string()),
            ("task_id", pa.int32()),
            ("topic", pa.string()),
            # Samples are per topic: null. Hours exported before (migration 0006) hold a row per partition, whose lags
            # the throughput report must sum per partition; one schema reads both.
            ("partition", pa.int32()),
            ("destination_topic", pa.string()),
            ("interval_start", TIMESTAMP),
            ("interval_end", TIMESTAMP),
            ("records", pa.int64()),
            ("bytes", pa.int64()),
            ("latency_min_ms", pa.int64()),
            ("latency_max_ms", pa.int64()),
            ("latency_sum_ms", pa.int64()),
            ("latency_count", pa.int64()),
            ("lag", pa.int64()),
            *((c, pa.int64()) for c in BUCKET_COLUMNS),
        ]
    ),
    "metadata_snapshots": _schema(
        [
            ("snapshot_id", pa.int64()),
            ("connector", pa.string()),
            ("cluster", pa.string()),
            ("taken_at", TIMESTAMP),
            ("error", pa.string()),
            ("topic", pa.string()),
            ("partitions", pa.int32()),
        ]
    ),
    "connectors": _schema(
        [
            ("connector", pa.string()),
            ("state", pa.string()),
            ("version", pa.int32()),
            ("tasks_max", pa.int32()),
            ("source_cluster_alias", pa.string()),
            ("target_cluster_alias", pa.string()),
            ("enable_destination_topic_checking", pa.bool_()),
            ("enable_partition_matching", pa.bool_()),
            ("config_error", pa.string()),
            ("config", pa.string()),
        ]
    ),
    "connector_routes": _schema(
        [
            ("connector", pa.string()),
            ("source_topic", pa.string()),
            ("destination_topic", pa.string()),
            ("cycle", pa.bool_()),
        ]
    ),
    "assignments": _schema(
        [
            ("connector", pa.string()),
            ("generation", pa.int64()),
            ("task_id", pa.int32()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
        ]
    ),
    "partition_status": _schema(
        [
            ("connector", pa.string()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("task_id", pa.int32()),
            ("state", pa.string()),
            ("reason", pa.string()),
            ("updated_at", TIMESTAMP),
        ]
    ),
}


def hour_floor(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def hour_dir(lake: Path, table: str, hour: datetime) -> Path:
    return lake / table / f"hour={hour_floor(hour):%Y-%m-%dT%H}"


def state_path(lake: Path, table: str) -> Path:
    return lake / "state" / f"{table}.parquet"


def hourly_files(lake: Path, table: str, start: datetime, end: datetime) -> list[Path]:
    """Parquet files of `table` for the hours overlapping [start, end)."""
    files, hour = [], hour_floor(start)
    while hour < end:
        files += sorted(hour_dir(lake, table, hour).glob(PART_GLOB))
        hour += HOUR
    return files


@dataclass(frozen=True)
class HourExport:
    hour: datetime
    rows: dict[str, int]  # table -> rows written (hourly tables and state tables)
    sealed: bool


@dataclass(frozen=True)
class PruneResult:
    metric_samples_deleted: int
    snapshots_deleted: int
    metric_samples_remaining: int
    awaiting_export: list[str] = field(default_factory=list)  # hours past retention not sealed in the lake


def export_hour(engine: Engine, lake: Path, hour: datetime, now: datetime | None = None) -> HourExport:
    """Write one hour of time series and the current state tables; replaces whatever that hour held."""
    now = now or datetime.now(UTC)
    start = hour_floor(hour)
    end = start + HOUR
    store = Store(engine)
    connectors = store.list_connectors()
    configs = _connector_configs(connectors)
    manifest = _manifest(lake, "metric_samples", start)
    after = manifest.get("max_id") if now < end and manifest else None  # the running hour: only what is new
    samples = _metric_batches(store, start, end, configs, after)
    snapshots = (
        pa.Table.from_pylist(rows, schema=SCHEMAS["metadata_snapshots"])
        for rows in store.snapshot_topics(start, end, _FETCH_ROWS)
    )
    rows = {
        "metric_samples": _write(lake, "metric_samples", start, now, samples, append_to=manifest if after else None),
        "metadata_snapshots": _write(lake, "metadata_snapshots", start, now, snapshots),
    }
    for table, data in _state_tables(store, connectors, configs).items():
        _replace(state_path(lake, table), pa.Table.from_pylist(data, schema=SCHEMAS[table]))
        rows[table] = len(data)
    return HourExport(start, rows, sealed=now >= end + SEAL_GRACE)


def _manifest(lake: Path, table: str, hour: datetime) -> dict[str, Any]:
    path = hour_dir(lake, table, hour) / MANIFEST_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def is_sealed(lake: Path, table: str, hour: datetime) -> bool:
    """Exported in full after the hour ended plus the grace period (an increment never seals)."""
    full_export_at = _manifest(lake, table, hour).get("full_export_at")
    return full_export_at is not None and datetime.fromisoformat(full_export_at) >= hour_floor(hour) + HOUR + SEAL_GRACE


def prune(engine: Engine, lake: Path, retention: timedelta, now: datetime | None = None) -> PruneResult:
    """Delete Postgres rows older than `retention` whose hour is sealed in the lake.

    The latest snapshot of each connector and cluster is always kept: the monitor compares against it.
    """
    now = now or datetime.now(UTC)
    cutoff = now - retention
    store = Store(engine)
    old_hours = store.metric_sample_hours(cutoff)
    sealed = [h for h in old_hours if is_sealed(lake, "metric_samples", h)]
    awaiting = sorted(f"{h:%Y-%m-%d-%H}:00" for h in old_hours if h not in sealed)
    deleted = store.delete_metric_samples(cutoff, sealed) if sealed else 0
    sealed_snapshots = [h for h in store.snapshot_hours(cutoff) if is_sealed(lake, "metadata_snapshots", h)]
    snapshots_deleted = store.delete_snapshots(cutoff, sealed_snapshots) if sealed_snapshots else 0
    return PruneResult(deleted, snapshots_deleted, store.count_metric_samples(), awaiting)


# -- the store's records as rows ------------------------------------------------------------------------------


def _connector_configs(connectors: list[ConnectorRecord]) -> dict[str, ConnectorConfig | str]:
    """Each connector's current configuration, or why it cannot be parsed here (e.g. an unresolvable secret)."""
    out: dict[str, ConnectorConfig | str] = {}
    for connector in connectors:
        try:
            out[connector.name] = load(connector.properties)
        except ConnectorConfigError as exc:
            out[connector.name] = str(exc)
    return out


def _metric_batches(
    store: Store, start: datetime, end: datetime, configs: Mapping[str, ConnectorConfig | str], after: int | None
) -> Iterator[pa.Table]:
    """The hour's samples (those with an id above `after`, if given) as Arrow tables, built column by column."""
    destination: dict[tuple[str, str], str | None] = {}

    def destination_of(connector: str, topic: str) -> str | None:
        key = (connector, topic)
        if key not in destination:
            config = configs.get(connector)
            destination[key] = config.namer.destination_topic(topic) if isinstance(config, ConnectorConfig) else None
        return destination[key]

    schema = SCHEMAS["metric_samples"]
    for columns in store.metric_sample_columns(start, end, after or 0, BUCKET_LABELS, _FETCH_ROWS):
        columns["partition"] = (None,) * len(columns["id"])  # samples are per topic
        columns["destination_topic"] = tuple(map(destination_of, columns["connector"], columns["topic"]))
        yield pa.table([pa.array(columns[f.name], f.type) for f in schema], schema=schema)


def _state_tables(
    store: Store, connectors: list[ConnectorRecord], configs: Mapping[str, ConnectorConfig | str]
) -> dict[str, list[dict[str, Any]]]:
    return {
        "connectors": [_connector_row(connector, configs.get(connector.name)) for connector in connectors],
        "connector_routes": _routes(sorted(store.source_topics_seen()), configs),
        "assignments": [
            {"connector": connector, "generation": generation, "task_id": task_id, "topic": topic, "partition": p}
            for connector, (generation, tasks) in store.current_assignments().items()
            for task_id, partitions in tasks.items()
            for topic, p in partitions
        ],
        "partition_status": [
            {
                "connector": connector,
                "topic": topic,
                "partition": p,
                "task_id": status.task_id,
                "state": status.state.value,
                "reason": status.reason,
                "updated_at": status.updated_at,
            }
            for connector, statuses in store.every_partition_status().items()
            for (topic, p), status in statuses.items()
        ],
    }


def _connector_row(stored: ConnectorRecord, config: ConnectorConfig | str | None) -> dict[str, Any]:
    """The connector's row: its stored state and, if its configuration loads, the settings the reports read."""
    parsed = config if isinstance(config, ConnectorConfig) else None
    return {
        "connector": stored.name,
        "state": stored.state.value,
        "version": stored.version,
        "tasks_max": stored.tasks_max,
        "source_cluster_alias": parsed.source_cluster_alias if parsed else None,
        "target_cluster_alias": parsed.target_cluster_alias if parsed else None,
        "enable_destination_topic_checking": parsed.enable_destination_topic_checking if parsed else None,
        "enable_partition_matching": parsed.enable_partition_matching if parsed else None,
        "config_error": None if parsed else str(config),
        "config": json.dumps(mask_properties(stored.properties)),
    }


def _routes(seen_topics: list[tuple[str, str]], configs: Mapping[str, ConnectorConfig | str]) -> list[dict[str, Any]]:
    """Each source topic seen that its connector selects, with its destination topic and whether it is a cycle."""
    routes = []
    for name, topic in seen_topics:
        config = configs.get(name)
        if isinstance(config, ConnectorConfig) and config.selector.matches(topic):
            routes.append(
                {
                    "connector": name,
                    "source_topic": topic,
                    "destination_topic": config.namer.destination_topic(topic),
                    "cycle": config.namer.is_cycle(topic),
                }
            )
    return routes


# -- writing Parquet ------------------------------------------------------------------------------------------


def _write(
    lake: Path,
    table: str,
    hour: datetime,
    now: datetime,
    batches: Iterator[pa.Table],
    append_to: dict[str, Any] | None = None,
) -> int:
    """Write the hour's rows to a temporary file and swap it in, then the manifest; returns the hour's row count.

    `append_to` (the hour's manifest) adds a file of new rows instead of replacing the hour's files.
    """
    directory = hour_dir(lake, table, hour)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{PART_FILE}.tmp"
    rows, first_id, max_id = 0, None, None
    writer: pq.ParquetWriter | None = None
    try:
        for batch in batches:
            if writer is None:
                writer = pq.ParquetWriter(tmp, SCHEMAS[table])
            writer.write_table(batch)
            rows += batch.num_rows
            if "id" in batch.column_names and batch.num_rows:
                first_id = batch["id"][0].as_py() if first_id is None else first_id
                max_id = batch["id"][-1].as_py()
    finally:
        if writer is not None:
            writer.close()
    if append_to is not None:
        if writer is not None:
            os.replace(tmp, directory / f"part-{first_id}.parquet")
        total: int = append_to["rows"] + rows
        manifest = {**append_to, "rows": total, "max_id": max_id or append_to["max_id"]}
    else:
        stale = [p for p in directory.glob(PART_GLOB) if p.name != PART_FILE]
        if writer is None:
            (directory / PART_FILE).unlink(missing_ok=True)  # an hour that is empty now holds no rows
        else:
            os.replace(tmp, directory / PART_FILE)
        for path in stale:  # increments are inside the full export now
            path.unlink()
        total = rows
        manifest = {
            "table": table,
            "hour": f"{hour:%Y-%m-%dT%H}",
            "rows": rows,
            "max_id": max_id or 0,
            "full_export_at": now.isoformat(),
        }
    (directory / MANIFEST_FILE).write_text(json.dumps({**manifest, "exported_at": now.isoformat()}))
    return total


def _replace(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
