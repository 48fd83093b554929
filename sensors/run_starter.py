"""The run starter sensor: starts the runs the store asks for. It keeps the metadata watcher running and every
assigned task at its runs (owner + standbys), or, with MIRUS_REPLICATOR_WORKERS, that many worker runs hosting the
tasks between them; and it keeps the `connectors` dynamic partitions and asset current.

Built by `build_run_starter` from what it launches (the replicator and watcher jobs) and the asset event it
records, so that it imports neither `assets/` nor the jobs. Metadata is read by the watcher run
(`replicator/discovery/watcher.py`), not here: a tick waits for the sensor daemon's 5 s loop, the watcher looks twice
a second. A tick touches no Kafka cluster.
"""

import time
from collections.abc import Callable, Mapping, Sequence

import dagster as dg
from pydantic import BaseModel

from mirus_dagster.constants import CONNECTOR_PARTITIONS, RUN_STARTER_SENSOR, WATCHER_JOB
from mirus_dagster.dagster_resources import PlatformDatabase
from mirus_dagster.run_launchers import replicator_launcher_tags
from replicator.configuration.connector import ConnectorConfigError, load
from replicator.state.records import ConnectorRecord, ConnectorState, ConnectorStatus, PartitionHealth
from replicator.state.store import Store
from sensors.decisions import start_decision
from sensors.task_runs import (
    LIVE,
    NEVER_RAN,
    task_histories,
    task_run_requests,
    worker_histories,
    worker_run_request,
)

# Below the sensor daemon's own 5 s loop on purpose: an interval equal to it makes the daemon skip a tick whenever
# the previous evaluation was due a few milliseconds late.
EVALUATION_INTERVAL_S = 1
MAX_FINDINGS = 10  # missing destination partitions named per connector; the rest are counted


class RunStarterCursor(BaseModel):
    fingerprint: str = ""  # what the connectors table showed last; a change is reported to the asset
    reported_at: float = 0.0  # when the connectors asset was last recorded by this sensor


ConnectorsEvent = Callable[[Store, str, dg.DagsterInstance, Mapping[str, Sequence[str]]], dg.AssetMaterialization]


def findings_of(status: ConnectorStatus) -> list[str]:
    """What an operator must know from the watcher's last poll: source partitions it holds back because their
    destination is missing (the connector then replicates less than it selects, or nothing)."""
    missing = sorted(
        tp
        for tp, row in status.unhealthy_partitions.items()
        if row.task_id is None and row.state == PartitionHealth.PAUSED
    )
    named = [f"{topic}[{partition}]" for topic, partition in missing[:MAX_FINDINGS]]
    if not missing:
        return []
    more = f" (+{len(missing) - MAX_FINDINGS} more)" if len(missing) > MAX_FINDINGS else ""
    return [f"missing at destination, not replicated: {', '.join(named)}{more}"]


def build_run_starter(
    job: dg.JobDefinition,
    watcher_job: dg.JobDefinition,
    *,
    connectors_event: ConnectorsEvent,
    refresh_s: float,
    worker_job: dg.JobDefinition | None = None,
    workers: int = 0,
) -> dg.SensorDefinition:
    """The sensor launching `job` (the replicator) and `watcher_job`, recording `connectors_event` changes; with
    `workers` > 0, `workers` runs of `worker_job` instead of a run per task."""
    if workers and worker_job is None:
        raise ValueError("workers need the worker job")

    @dg.sensor(
        name=RUN_STARTER_SENSOR,
        jobs=[job, watcher_job, *([worker_job] if worker_job else [])],
        minimum_interval_seconds=EVALUATION_INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Keep the metadata watcher run alive, and start replicator runs for every assigned task that has "
            "fewer than its owner and standby runs (task.standby.runs)."
        ),
    )
    def run_starter(context: dg.SensorEvaluationContext, platform: PlatformDatabase) -> dg.SensorResult:
        return _evaluate(context, platform.store(), connectors_event, refresh_s, workers)

    return run_starter


def _evaluate(
    context: dg.SensorEvaluationContext,
    store: Store,
    connectors_event: ConnectorsEvent,
    refresh_s: float,
    workers: int,
) -> dg.SensorResult:
    cursor = RunStarterCursor.model_validate_json(context.cursor) if context.cursor else RunStarterCursor()
    run_requests: list[dg.RunRequest] = []
    asset_events: list[dg.AssetMaterialization] = []
    if not context.instance.get_runs(dg.RunsFilter(job_name=WATCHER_JOB, statuses=list(LIVE)), limit=1):
        run_requests.append(dg.RunRequest(job_name=WATCHER_JOB))
    # The partitions are read before the connectors: a connector that `put_connector` stores and registers while
    # this tick runs is then never seen as registered but absent, which would delete its partition for a tick.
    known = set(context.instance.get_dynamic_partitions(CONNECTOR_PARTITIONS))
    records = store.list_connectors()
    if workers:
        run_requests += _worker_starts(context.instance, workers)
    else:
        for record in records:
            if record.state == ConnectorState.RUNNING:
                run_requests += _task_starts(context.instance, store, record)
    names = {r.name for r in records}
    # Everything the connectors table shows but heartbeat times and lag: a change is recorded at once, and those
    # are kept fresh by recording at least every `refresh_s` while anything runs.
    statuses = store.connector_statuses()
    findings = {s.name: findings_of(s) for s in statuses if s.state == ConnectorState.RUNNING}
    fingerprint = _fingerprint(statuses, records, findings)
    running = any(r.state == ConnectorState.RUNNING for r in records)
    changed = fingerprint != cursor.fingerprint
    if changed or (running and time.time() - cursor.reported_at >= refresh_s):
        cursor.fingerprint, cursor.reported_at = fingerprint, time.time()
        reason = "run starter saw a change" if changed else "refresh (heartbeats and lag)"
        asset_events.append(connectors_event(store, reason, context.instance, findings))
    partitions: list[dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest] = []
    if names - known:
        partitions.append(dg.AddDynamicPartitionsRequest(CONNECTOR_PARTITIONS, sorted(names - known)))
    if known - names:
        partitions.append(dg.DeleteDynamicPartitionsRequest(CONNECTOR_PARTITIONS, sorted(known - names)))
    return dg.SensorResult(
        run_requests=run_requests,
        cursor=cursor.model_dump_json(),
        dynamic_partitions_requests=partitions,
        asset_events=asset_events,
    )


def _task_starts(instance: dg.DagsterInstance, store: Store, record: ConnectorRecord) -> list[dg.RunRequest]:
    """Runs to start for the running connector's assigned tasks: those short of an owner and its standbys."""
    try:
        wanted = 1 + load(record.properties).task_standby_runs
    except ConnectorConfigError:
        return []  # the watcher reports it
    run_requests: list[dg.RunRequest] = []
    histories = task_histories(instance, record.name)
    for task_id in sorted(store.read_assignment(record.name)):
        history = histories.get(task_id, NEVER_RAN)
        decision = start_decision(history, wanted)
        if decision.launch:
            run_requests += task_run_requests(
                record.name,
                task_id,
                decision.reason,
                decision.runs,
                history.live_runs,
                replicator_launcher_tags(instance),
            )
    return run_requests


def _worker_starts(instance: dg.DagsterInstance, workers: int) -> list[dg.RunRequest]:
    """Runs to start for the estate's workers that have none live (a failed one is left to the supervisor)."""
    histories = worker_histories(instance, workers)
    run_requests = []
    for worker in range(workers):
        decision = start_decision(histories.get(worker, NEVER_RAN))
        if decision.launch:
            run_requests.append(
                worker_run_request(worker, workers, decision.reason, replicator_launcher_tags(instance, worker=True))
            )
    return run_requests


def _fingerprint(
    statuses: list[ConnectorStatus], records: list[ConnectorRecord], findings: dict[str, list[str]]
) -> str:
    """What the connectors table shows, but heartbeat times and lag: a change of it is recorded at once."""
    return repr(
        [
            (
                s.name,
                s.state,
                s.version,
                s.assignment_generation,
                [(t.task_id, t.state, t.partitions, t.restart_attempts) for t in s.tasks],
                s.metadata_errors,
                sorted(s.flow_problems.items()),
                sorted(s.unhealthy_partitions),
                sorted(s.operator_pauses.items()),
            )
            for s in statuses
        ]
        + [(r.name, r.restart_requested_at) for r in records]
        + sorted(findings.items())
    )
