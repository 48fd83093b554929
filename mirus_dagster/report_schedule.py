"""The reports' job and schedule: export the current hour to the lake, prune Postgres, refresh every report.

Every `MIRUS_REPORT_CRON` (default every 15 minutes). During the first half hour after an hour ends, a second run
exports that hour once more, so its last samples reach the lake and the hour is sealed (only sealed hours are
pruned from Postgres). The same job runs on demand from the launchpad (with no hour chosen, it exports the latest
complete hour); older hours are backfilled from the `lake` assets' partitions page.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import dagster as dg

from mirus_dagster.constants import (
    DESTINATION_TOPICS_ASSET,
    ENV_REPORT_CRON,
    ENV_REPORT_SCHEDULE,
    KIND_REPORT,
    LAKE_GROUP,
    LAKE_METRIC_SAMPLES_ASSET,
    LAKE_SNAPSHOTS_ASSET,
    LAKE_STATE_ASSET,
    REPORTS_GROUP,
    REPORTS_JOB,
    REPORTS_SCHEDULE,
    SOURCE_TOPICS_ASSET,
    TAG_KIND,
    TAG_REASON,
)

DEFAULT_REPORT_CRON = "*/15 * * * *"
RESEAL_WITHIN = timedelta(minutes=30)
LAKE_ASSETS = (LAKE_METRIC_SAMPLES_ASSET, LAKE_SNAPSHOTS_ASSET, LAKE_STATE_ASSET)

reports_job = dg.define_asset_job(
    REPORTS_JOB,
    selection=dg.AssetSelection.groups(LAKE_GROUP, REPORTS_GROUP)
    | dg.AssetSelection.assets(SOURCE_TOPICS_ASSET, DESTINATION_TOPICS_ASSET),
    tags={TAG_KIND: KIND_REPORT},
    # One process, hence one Spark session, for the three reports (the multiprocess executor would start three).
    executor_def=dg.in_process_executor,
    description="Export an hour of the platform's records to the lake, prune Postgres, and refresh the reports.",
)


def hour_key(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%d-%H}:00"


def report_run_requests(now: datetime) -> list[dg.RunRequest]:
    """This hour's export and the reports; plus the previous hour's final export shortly after it ended."""
    requests = [dg.RunRequest(partition_key=hour_key(now), tags={TAG_KIND: KIND_REPORT})]
    hour_start = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    if now - hour_start < RESEAL_WITHIN:
        requests.append(
            dg.RunRequest(
                partition_key=hour_key(hour_start - timedelta(hours=1)),
                asset_selection=[dg.AssetKey.from_user_string(k) for k in LAKE_ASSETS],
                tags={TAG_KIND: KIND_REPORT, TAG_REASON: "seal the previous hour"},
            )
        )
    return requests


@dg.schedule(
    name=REPORTS_SCHEDULE,
    job=reports_job,
    cron_schedule=os.environ.get(ENV_REPORT_CRON) or DEFAULT_REPORT_CRON,
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.STOPPED
    if os.environ.get(ENV_REPORT_SCHEDULE, "").lower() == "stopped"
    else dg.DefaultScheduleStatus.RUNNING,
    description="Refresh the lake and the replication reports (MIRUS_REPORT_CRON, default every 15 minutes).",
)
def reports_schedule(context: dg.ScheduleEvaluationContext) -> list[dg.RunRequest]:
    return report_run_requests(context.scheduled_execution_time or datetime.now(UTC))
