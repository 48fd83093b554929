"""The monitor sensor: keeps the metadata watcher running and every assigned task at its runs (owner + standbys).

Built by `build_kafka_monitor` from what it launches (the replicator and watcher jobs) and the asset event it
records, so that it imports neither `assets/` nor the jobs. Metadata is read by the watcher run
(`replicator/watcher.py`), not here: a tick waits for the sensor daemon's 5 s loop, the watcher looks every second.
A tick touches no Kafka cluster.
"""

from collections.abc import Callable

import dagster as dg
from pydantic import BaseModel

from mirus_dagster.constants import CONNECTOR_PARTITIONS, MONITOR_SENSOR, WATCHER_JOB
from mirus_dagster.resources import PlatformDatabase
from replicator.config import ConnectorConfigError, load
from replicator.store import ConnectorState, Store
from sensors.decisions import start_decision
from sensors.task_runs import LIVE, NEVER_RAN, run_request, task_histories

# Below the sensor daemon's own 5 s loop on purpose: an interval equal to it makes the daemon skip a tick whenever
# the previous evaluation was due a few milliseconds late.
EVALUATION_INTERVAL_S = 1


class MonitorCursor(BaseModel):
    fingerprint: str = ""  # what the connectors table showed last; a change is reported to the asset


def build_kafka_monitor(
    job: dg.JobDefinition,
    watcher_job: dg.JobDefinition,
    *,
    connectors_event: Callable[[Store, str], dg.AssetMaterialization],
) -> dg.SensorDefinition:
    """The sensor launching `job` (the replicator) and `watcher_job`, recording `connectors_event` changes."""

    @dg.sensor(
        name=MONITOR_SENSOR,
        jobs=[job, watcher_job],
        minimum_interval_seconds=EVALUATION_INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Keep the metadata watcher run alive, and start replicator runs for every assigned task that has "
            "fewer than its owner and standby runs (task.standby.runs)."
        ),
    )
    def kafka_monitor(context: dg.SensorEvaluationContext, platform: PlatformDatabase) -> dg.SensorResult:
        return _evaluate(context, platform.store(), connectors_event)

    return kafka_monitor


def _evaluate(
    context: dg.SensorEvaluationContext,
    store: Store,
    connectors_event: Callable[[Store, str], dg.AssetMaterialization],
) -> dg.SensorResult:
    cursor = MonitorCursor.model_validate_json(context.cursor) if context.cursor else MonitorCursor()
    run_requests: list[dg.RunRequest] = []
    asset_events: list[dg.AssetMaterialization] = []
    if not context.instance.get_runs(dg.RunsFilter(job_name=WATCHER_JOB, statuses=list(LIVE)), limit=1):
        run_requests.append(dg.RunRequest(job_name=WATCHER_JOB))
    records = store.list_connectors()
    for record in records:
        if record.state != ConnectorState.RUNNING:
            continue
        try:
            wanted = 1 + load(record.properties).standby_runs
        except ConnectorConfigError:
            continue  # the watcher reports it
        histories = task_histories(context.instance, record.name)
        for task_id in sorted(store.read_assignment(record.name)):
            decision = start_decision(histories.get(task_id, NEVER_RAN), wanted)
            if decision.launch:
                run_requests.extend(run_request(record.name, task_id, decision.reason) for _ in range(decision.runs))
    names = {r.name for r in records}
    fingerprint = repr([(r.name, r.state, r.version, r.assignment_generation, r.restart_requested_at) for r in records])
    if fingerprint != cursor.fingerprint:
        cursor.fingerprint = fingerprint
        asset_events.append(connectors_event(store, "monitor saw a change"))
    known = set(context.instance.get_dynamic_partitions(CONNECTOR_PARTITIONS))
    partitions = []
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
