"""Names the Dagster layer, its tests and benchmarks share: assets, partitions, jobs, ops, sensors, tags and
environment variables. Plain strings (no Dagster import), so the CLI and the engine's tools can use them too."""

from __future__ import annotations

# -- assets and partitions --
CONNECTORS_ASSET = "connectors"  # every connector, its state, tasks and problems (assets/connectors.py)
FLOWS_ASSET = "replication_flows"  # per connector, source topics -> destination topics (assets/flows.py)
CONNECTOR_PARTITIONS = "connectors"  # dynamic partitions: one per connector
ASSET_GROUP = "mirus"  # the estate's map: connectors, source topics, flows, destination topics
SOURCE_TOPICS_ASSET = "source_topics"  # per connector, the selected source topics (assets/topology.py)
DESTINATION_TOPICS_ASSET = "destination_topics"  # per connector, the topics its flow writes (assets/topology.py)

# -- the lake and the reports (assets/lake.py, assets/reports.py) --
LAKE_GROUP = "lake"
REPORTS_GROUP = "reports"
LAKE_METRIC_SAMPLES_ASSET = "lake/metric_samples"
LAKE_SNAPSHOTS_ASSET = "lake/metadata_snapshots"
LAKE_STATE_ASSET = "lake/platform_state"
LAKE_PARTITIONS_START = "2026-01-01-00:00"  # hourly partitions; earlier hours hold no rows
LATENCY_REPORT_ASSET = "replication_latency_report"
MISSING_REPORT_ASSET = "missing_partitions_report"
THROUGHPUT_REPORT_ASSET = "throughput_lag_report"
P99_CHECK = "p99_latency_within_threshold"
MISSING_CHECK = "no_missing_partitions"

# -- jobs and ops --
REPLICATOR_JOB = "replicator"
REPLICATE_OP = "replicate"
WORKER_JOB = "replicator_worker"  # a process hosting many connectors' tasks (MIRUS_REPLICATOR_WORKERS)
HOST_TASKS_OP = "host_tasks"
WATCHER_JOB = "metadata_watcher"
WATCH_OP = "watch_metadata"
PUT_CONNECTOR_JOB = "put_connector"
STORE_CONNECTOR_OP = "store_connector"
REPORTS_JOB = "refresh_reports"
PAUSE_PARTITION_JOB = "pause_partition"
RESUME_PARTITION_JOB = "resume_partition"


def admin_job_name(action: str) -> str:
    return f"{action}_connector"


def admin_op_name(action: str) -> str:
    return f"{action}_connector_op"


# -- sensors --
RUN_STARTER_SENSOR = "run_starter"
SUPERVISOR_SENSOR = "task_supervisor"
FAILURE_SENSOR = "run_failure_alerts"
REPORTS_SCHEDULE = "reports_schedule"

# -- run tags --
TAG_KIND = "mirus/kind"  # KIND_REPLICATOR, KIND_WATCHER, KIND_ADMIN or KIND_REPORT; the run queue limits runs by it
TAG_CONNECTOR = "mirus/connector"
TAG_TASK = "mirus/task"
TAG_WORKER = "mirus/worker"  # a worker run's index, and the estate's worker count it was started for
TAG_WORKERS = "mirus/workers"
TAG_REASON = "mirus/reason"  # why a sensor launched the run
TAG_SENSOR = "dagster/sensor_name"  # set by Dagster on runs a sensor launched
KIND_REPLICATOR = "replicator"
KIND_ADMIN = "admin"
KIND_REPORT = "report"
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
ENV_REPLICATOR_WORKERS = "MIRUS_REPLICATOR_WORKERS"  # > 0: tasks run in that many worker runs, not a run each
ENV_ALERT_WEBHOOK_URL = "MIRUS_ALERT_WEBHOOK_URL"  # the run-failure sensor posts each failed run there
ENV_SPARK_MASTER = "MIRUS_SPARK_MASTER"
ENV_LAKE_DIR = "MIRUS_LAKE_DIR"
ENV_RETENTION_HOURS = "MIRUS_METRICS_RETENTION_HOURS"
ENV_WINDOW_HOURS = "MIRUS_REPORT_WINDOW_HOURS"
ENV_STEP_MINUTES = "MIRUS_REPORT_STEP_MINUTES"
ENV_P99_THRESHOLD_MS = "MIRUS_REPORT_P99_THRESHOLD_MS"
ENV_REPORT_CRON = "MIRUS_REPORT_CRON"
ENV_REPORT_SCHEDULE = "MIRUS_REPORT_SCHEDULE"  # "stopped": the schedule starts stopped (runs on demand only)

# -- the demo that `mirus dev` sets up --
DEMO_CONNECTOR = "orders-mirror"
DEMO_TOPIC = "orders"
DEMO_PARTITIONS = 3
EXAMPLE_TOPIC = "payments"  # the launchpad's example connector copies it (mirus_dagster.settings.example_connector)
