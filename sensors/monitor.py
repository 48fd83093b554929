"""The monitor sensor (Mirus's KafkaMonitor): cluster metadata → assignment generations → runs for idle tasks.

Built by `build_kafka_monitor` from what it launches (the replicator job) and the asset events it records, so
that it imports neither `assets/` nor the jobs. A tick creates Kafka clients only for connectors whose
`monitor.poll.wait.ms` has come round (one admin client per cluster it reads); nothing else touches Kafka.
"""

import time
from collections.abc import Callable

import dagster as dg
from pydantic import BaseModel

from mirus_dagster.constants import CONNECTOR_PARTITIONS, MONITOR_SENSOR
from mirus_dagster.resources import PlatformDatabase
from replicator.config import ConnectorConfigError
from replicator.monitor import KafkaMonitor, MetadataUnavailableError, MonitorResult
from replicator.store import ConnectorState, Store, UnknownConnectorError
from sensors.decisions import start_decision
from sensors.task_runs import NEVER_RAN, run_request, task_histories

# Below the sensor daemon's own 5 s loop on purpose: an interval equal to it makes the daemon skip a tick whenever
# the previous evaluation was due a few milliseconds late, which doubles discovery time.
EVALUATION_INTERVAL_S = 1
EVALUATION_BUDGET_S = 30.0  # far below Dagster's 60 s sensor timeout; the rest waits for the next tick
MAX_BACKOFF_S = 64.0  # Mirus: retriable monitor errors back off 1, 2, 4 … 64 s


class ConnectorPoll(BaseModel):
    next_poll_at: float = 0.0
    failures: int = 0
    error: str | None = None


class MonitorCursor(BaseModel):
    polls: dict[str, ConnectorPoll] = {}
    fingerprint: str = ""  # what the connectors table showed last; a change is reported to the asset


def build_kafka_monitor(
    job: dg.JobDefinition,
    *,
    connectors_event: Callable[[Store, str], dg.AssetMaterialization],
    flow_event: Callable[[str, MonitorResult], dg.AssetMaterialization],
) -> dg.SensorDefinition:
    """The sensor launching `job` (the replicator) and recording `connectors_event` / `flow_event` changes."""

    @dg.sensor(
        name=MONITOR_SENSOR,
        job=job,
        minimum_interval_seconds=EVALUATION_INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Per connector, every monitor.poll.wait.ms: read source and destination metadata, apply selection, "
            "naming and destination checking, write a new assignment generation when partition membership "
            "changed, and start a replicator run for every assigned task that has none."
        ),
    )
    def kafka_monitor(context: dg.SensorEvaluationContext, platform: PlatformDatabase) -> dg.SensorResult:
        return _evaluate(context, platform.store(), connectors_event, flow_event)

    return kafka_monitor


def _evaluate(
    context: dg.SensorEvaluationContext,
    store: Store,
    connectors_event: Callable[[Store, str], dg.AssetMaterialization],
    flow_event: Callable[[str, MonitorResult], dg.AssetMaterialization],
) -> dg.SensorResult:
    cursor = MonitorCursor.model_validate_json(context.cursor) if context.cursor else MonitorCursor()
    started = time.monotonic()
    monitor = KafkaMonitor(store)
    run_requests: list[dg.RunRequest] = []
    asset_events: list[dg.AssetMaterialization] = []
    records = store.list_connectors()
    for record in records:
        if record.state != ConnectorState.RUNNING:
            continue
        poll = cursor.polls.get(record.name, ConnectorPoll())
        now = time.time()
        if now >= poll.next_poll_at and time.monotonic() - started < EVALUATION_BUDGET_S:
            try:
                result = monitor.poll(record.name)
            except (MetadataUnavailableError, ConnectorConfigError) as exc:
                backoff = min(2.0**poll.failures, MAX_BACKOFF_S)
                poll = ConnectorPoll(next_poll_at=now + backoff, failures=poll.failures + 1, error=str(exc))
                context.log.warning(f"{record.name}: {exc} (next attempt in {backoff:.0f}s)")
            except UnknownConnectorError:
                continue  # deleted while we looked
            else:
                poll = ConnectorPoll(next_poll_at=now + result.poll_wait_s)
                if result.changed:
                    missing = len(result.plan.missing_destination)
                    context.log.info(
                        f"{record.name}: generation {result.generation}, {len(result.plan.replicate)} partitions "
                        f"over {len(result.tasks)} tasks; missing at destination: {missing}"
                    )
                    asset_events.append(flow_event(record.name, result))
            cursor.polls[record.name] = poll
        histories = task_histories(context.instance, record.name)
        for task_id in sorted(store.read_assignment(record.name)):
            decision = start_decision(histories.get(task_id, NEVER_RAN))
            if decision.launch:
                run_requests.append(run_request(record.name, task_id, decision.reason))
    names = {r.name for r in records}
    cursor.polls = {name: poll for name, poll in cursor.polls.items() if name in names}
    fingerprint = repr(
        [(r.name, r.state, r.version, r.assignment_generation, r.restart_requested_at) for r in records]
        + sorted((name, poll.error) for name, poll in cursor.polls.items() if poll.error)
    )
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
