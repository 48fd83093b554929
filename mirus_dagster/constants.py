"""Names the Dagster layer, its tests and benchmarks share: assets, partitions, jobs, ops, sensors, tags and
environment variables. Plain strings (no Dagster import), so the CLI and the engine's tools can use them too."""

from __future__ import annotations

# -- assets and partitions --
CONNECTORS_ASSET = "connectors"  # every connector, its state, tasks and problems (assets/connectors.py)
FLOWS_ASSET = "replication_flows"  # per connector, source topics -> destination topics (assets/flows.py)
CONNECTOR_PARTITIONS = "connectors"  # dynamic partitions: one per connector
ASSET_GROUP = "mirus"

# -- jobs and ops --
REPLICATOR_JOB = "replicator"
REPLICATE_OP = "replicate"
WATCHER_JOB = "metadata_watcher"
WATCH_OP = "watch_metadata"
PUT_CONNECTOR_JOB = "put_connector"
STORE_CONNECTOR_OP = "store_connector"


def admin_job_name(action: str) -> str:
    return f"{action}_connector"


def admin_op_name(action: str) -> str:
    return f"{action}_connector_op"


# -- sensors --
MONITOR_SENSOR = "kafka_monitor"
SUPERVISOR_SENSOR = "task_supervisor"

# -- run tags --
TAG_KIND = "mirus/kind"  # KIND_REPLICATOR, KIND_WATCHER or KIND_ADMIN; the run queue limits replicator runs by it
TAG_CONNECTOR = "mirus/connector"
TAG_TASK = "mirus/task"
TAG_REASON = "mirus/reason"  # why a sensor launched the run
TAG_SENSOR = "dagster/sensor_name"  # set by Dagster on runs a sensor launched
KIND_REPLICATOR = "replicator"
KIND_ADMIN = "admin"
KIND_WATCHER = "watcher"

# -- environment --
ENV_STATE_DIR = "MIRUS_STATE_DIR"
ENV_SOURCE_BOOTSTRAP = "MIRUS_SOURCE_BOOTSTRAP_SERVERS"
ENV_DESTINATION_BOOTSTRAP = "MIRUS_DESTINATION_BOOTSTRAP_SERVERS"
ENV_DATABASE_URL = "MIRUS_DATABASE_URL"
ENV_SOURCE_PORT = "MIRUS_SOURCE_PORT"
ENV_DESTINATION_PORT = "MIRUS_DESTINATION_PORT"
ENV_POSTGRES_PORT = "MIRUS_POSTGRES_PORT"
ENV_TASK_AUTO_RESTART = "MIRUS_TASK_AUTO_RESTART"

# -- the demo that `mirus dev` sets up --
DEMO_CONNECTOR = "orders-mirror"
DEMO_TOPIC = "orders"
DEMO_PARTITIONS = 3
