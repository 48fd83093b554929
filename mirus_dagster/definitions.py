"""The code location: every asset, job, sensor and resource of the platform, assembled once.

Resources come from the environment; unset, they point at the embedded local stack (`mirus dev`).
"""

from __future__ import annotations

import os

import dagster as dg

from assets.flows import connectors_spec, flows_spec
from mirus_dagster.jobs import admin_jobs, replicator
from mirus_dagster.resources import PlatformDatabase, SupervisorPolicy
from mirus_dagster.settings import ENV_DATABASE_URL, PlatformSettings
from mirus_dagster.stack import LocalStack
from sensors.monitor import kafka_monitor
from sensors.supervisor import task_supervisor


def _database_url() -> str | dg.EnvVar:
    # An EnvVar keeps a URL with a password out of the UI's resource view.
    if os.environ.get(ENV_DATABASE_URL):
        return dg.EnvVar(ENV_DATABASE_URL)
    return LocalStack(PlatformSettings.from_env()).endpoints.database_url


defs = dg.Definitions(
    assets=[connectors_spec, flows_spec],
    jobs=[replicator, *admin_jobs],
    sensors=[kafka_monitor, task_supervisor],
    resources={
        "platform": PlatformDatabase(database_url=_database_url()),
        "supervisor": SupervisorPolicy(
            auto_restart=os.environ.get("MIRUS_TASK_AUTO_RESTART", "true").lower() != "false",
        ),
    },
)
