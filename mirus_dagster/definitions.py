"""The code location: every asset, job, sensor and resource of the platform, assembled once.

The only module that imports `assets/` and `sensors/` (tests/test_layers.py checks it): jobs
and sensors are built here from what they launch and the asset events they record, so imports run one way. Resources
come from the environment; unset, they point at the embedded local stack (`mirus dev`).
"""

from __future__ import annotations

import os

import dagster as dg

from assets.connectors import REFRESH_S, connectors_materialization, connectors_spec
from assets.flows import flow_materialization, flows_spec
from assets.lake import platform_lake
from assets.reports import report_assets
from assets.topology import destination_topics, source_topics
from mirus_dagster.constants import ENV_ALERT_WEBHOOK_URL, ENV_DATABASE_URL, ENV_TASK_AUTO_RESTART
from mirus_dagster.dagster_resources import FailureWebhook, PlatformDatabase, SupervisorPolicy
from mirus_dagster.jobs import build_admin_jobs, build_watcher_job, replicator, replicator_worker
from mirus_dagster.report_schedule import reports_job, reports_schedule
from mirus_dagster.reporting import Reporting, SparkResource, spark_config, spark_master_from_env
from mirus_dagster.settings import PlatformSettings
from sensors.run_failure_alerts import build_run_failure_alerts
from sensors.run_starter import build_run_starter
from sensors.supervisor import build_task_supervisor


def _database_url() -> str | dg.EnvVar:
    # An EnvVar keeps a URL with a password out of the UI's resource view.
    if os.environ.get(ENV_DATABASE_URL):
        return dg.EnvVar(ENV_DATABASE_URL)
    return PlatformSettings.from_env().endpoints().database_url


admin_jobs = build_admin_jobs(connectors_materialization)
metadata_watcher = build_watcher_job(flow_materialization)
workers = PlatformSettings.from_env().workers()
run_starter = build_run_starter(
    replicator,
    metadata_watcher,
    connectors_event=connectors_materialization,
    refresh_s=REFRESH_S,
    worker_job=replicator_worker,
    workers=workers,
)
task_supervisor = build_task_supervisor(replicator, replicator_worker, workers)
run_failure_alerts = build_run_failure_alerts([replicator, replicator_worker, *admin_jobs], connectors_materialization)

defs = dg.Definitions(
    assets=[connectors_spec, flows_spec, source_topics, destination_topics, platform_lake, *report_assets],
    jobs=[replicator, replicator_worker, metadata_watcher, *admin_jobs, reports_job],
    schedules=[reports_schedule],
    # Asset runs launched from the UI run in one process: the reports then share one Spark session.
    executor=dg.in_process_executor,
    sensors=[run_starter, task_supervisor, run_failure_alerts],
    resources={
        "platform": PlatformDatabase(database_url=_database_url()),
        "supervisor": SupervisorPolicy(
            auto_restart=os.environ.get(ENV_TASK_AUTO_RESTART, "true").lower() != "false",
        ),
        # An EnvVar keeps the URL (it often holds a token) out of the UI.
        "failure_webhook": FailureWebhook(
            url=dg.EnvVar(ENV_ALERT_WEBHOOK_URL) if os.environ.get(ENV_ALERT_WEBHOOK_URL) else None
        ),
        "reporting": Reporting.from_env(),
        "pyspark": SparkResource(spark_config=spark_config(spark_master_from_env())),
    },
)
