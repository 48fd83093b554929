"""The lake export as hourly-partitioned assets: one run exports one hour, then prunes Postgres (export, then prune)."""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import dagster as dg

from mirus_dagster.constants import (
    CONNECTORS_ASSET,
    LAKE_GROUP,
    LAKE_METRIC_SAMPLES_ASSET,
    LAKE_PARTITIONS_START,
    LAKE_SNAPSHOTS_ASSET,
    LAKE_STATE_ASSET,
)
from mirus_dagster.dagster_resources import PlatformDatabase
from mirus_dagster.reporting import Reporting

# The current hour is a partition too (end_offset=1): the schedule refreshes it every run.
hourly_partitions = dg.HourlyPartitionsDefinition(start_date=LAKE_PARTITIONS_START, end_offset=1)

METRIC_SAMPLES_LAKE = dg.AssetKey.from_user_string(LAKE_METRIC_SAMPLES_ASSET)
SNAPSHOTS_LAKE = dg.AssetKey.from_user_string(LAKE_SNAPSHOTS_ASSET)
STATE_LAKE = dg.AssetKey.from_user_string(LAKE_STATE_ASSET)


def latest_complete_hour(now: datetime) -> datetime:
    """The start of the last hour that has ended before `now`."""
    return now.astimezone(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            METRIC_SAMPLES_LAKE,
            group_name=LAKE_GROUP,
            deps=[CONNECTORS_ASSET],
            description="Metric samples (records, bytes, latency summary and histogram, lag) per task, "
            "source topic and interval, with the destination topic, by hour of interval end.",
        ),
        dg.AssetSpec(
            SNAPSHOTS_LAKE,
            group_name=LAKE_GROUP,
            deps=[CONNECTORS_ASSET],
            description="Cluster metadata the monitor saw (one row per snapshot and topic), by hour.",
        ),
        dg.AssetSpec(
            STATE_LAKE,
            group_name=LAKE_GROUP,
            deps=[CONNECTORS_ASSET],
            description="Connectors (configs masked), topic routes, current assignments and partition "
            "status, as of the latest export.",
        ),
    ],
    partitions_def=hourly_partitions,
    description="Export one hour of the platform's records from Postgres to Parquet, then delete exported samples "
    "older than the retention from Postgres.",
)
def platform_lake(
    context: dg.AssetExecutionContext, platform: PlatformDatabase, reporting: Reporting
) -> Iterator[dg.MaterializeResult]:
    # Arrow only in the runs that export: every run process loads this code location.
    from reports.lake import export_hour, hour_dir, prune, state_path

    engine = platform.store().engine
    if context.has_partition_key:
        hour = context.partition_time_window.start
    else:
        # Launched without choosing an hour (the launchpad allows it): the latest hour that has ended.
        hour = latest_complete_hour(datetime.now(UTC))
        context.log.info(f"no partition chosen: exporting the latest complete hour, {hour:%Y-%m-%d %H}:00 UTC")
    exported = export_hour(engine, reporting.lake, hour)
    pruned = prune(engine, reporting.lake, reporting.retention, datetime.now(UTC))
    retention: dict[str, float | dg.MetadataValue] = {
        "postgres metric_samples rows": pruned.metric_samples_remaining,
        "pruned metric_samples rows": pruned.metric_samples_deleted,
        "pruned snapshot rows": pruned.snapshots_deleted,
        "retention hours": reporting.retention_hours,
        "hours past retention awaiting export": dg.MetadataValue.json(pruned.awaiting_export),
    }
    for key, table in ((METRIC_SAMPLES_LAKE, "metric_samples"), (SNAPSHOTS_LAKE, "metadata_snapshots")):
        yield dg.MaterializeResult(
            asset_key=key,
            metadata={
                "rows": exported.rows[table],
                "sealed": exported.sealed,
                "hour": f"{hour:%Y-%m-%d %H}:00 UTC",
                "path": dg.MetadataValue.path(str(hour_dir(reporting.lake, table, hour))),
                **(retention if table == "metric_samples" else {}),
            },
        )
    yield dg.MaterializeResult(
        asset_key=STATE_LAKE,
        metadata={
            **{
                f"{table} rows": exported.rows[table]
                for table in ("connectors", "connector_routes", "assignments", "partition_status")
            },
            "path": dg.MetadataValue.path(str(state_path(reporting.lake, "connectors").parent)),
        },
    )
