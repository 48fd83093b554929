"""The code location: every asset, job, sensor and resource of the platform, assembled once.

The only module that imports `assets/` and `sensors/` (tests/test_layers.py checks it): jobs and sensors are
built here from what they launch and the asset events they record, so imports run one way. Resources come from
the environment; unset, they point at the embedded local stack (`mirus dev`).
"""

from __future__ import annotations

import os

import dagster as dg

from assets.connectors import connectors_materialization, connectors_spec
from assets.flows import flow_materialization, flows_spec
from mirus_dagster.constants import ENV_DATABASE_URL, ENV_TASK_AUTO_RESTART
from mirus_dagster.jobs import build_admin_jobs, build_watcher_job, replicator
from mirus_dagster.resources import PlatformDatabase, SupervisorPolicy
from mirus_dagster.settings import PlatformSettings
from mirus_dagster.stack import LocalStack
from sensors.monitor import build_kafka_monitor
from sensors.supervisor import build_task_supervisor


def _database_url() -> str | dg.EnvVar:
    # An EnvVar keeps a URL with a password out of the UI's resource view.
    if os.environ.get(ENV_DATABASE_URL):
        return dg.EnvVar(ENV_DATABASE_URL)
    return LocalStack(PlatformSettings.from_env()).endpoints.database_url


admin_jobs = build_admin_jobs(connectors_materialization)
metadata_watcher = build_watcher_job(connectors_materialization, flow_materialization)
kafka_monitor = build_kafka_monitor(replicator, metadata_watcher, connectors_event=connectors_materialization)
task_supervisor = build_task_supervisor(replicator)

defs = dg.Definitions(
    assets=[connectors_spec, flows_spec],
    jobs=[replicator, metadata_watcher, *admin_jobs],
    sensors=[kafka_monitor, task_supervisor],
    resources={
        "platform": PlatformDatabase(database_url=_database_url()),
        "supervisor": SupervisorPolicy(
            auto_restart=os.environ.get(ENV_TASK_AUTO_RESTART, "true").lower() != "false",
        ),
    },
)
