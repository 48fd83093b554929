"""The monitor sensor (Mirus's KafkaMonitor): cluster metadata → assignment generations → runs for idle tasks.

Built by `build_kafka_monitor` from what it launches (the replicator job) and the asset events it records, so
that it imports neither `assets/` nor the jobs. A tick creates Kafka clients only for connectors whose
`monitor.poll.wait.ms` has come round (one admin client per cluster it reads); nothing else touches Kafka.
"""

import time
from collections.abc import Callable, Mapping, Sequence

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


MAX_FINDINGS = 10  # missing destination partitions named per connector; the rest are counted


class ConnectorPoll(BaseModel):
    next_poll_at: float = 0.0
    failures: int = 0
    error: str | None = None
    findings: list[str] = []  # problems the last successful poll found (shown by the connectors asset)


class MonitorCursor(BaseModel):
    polls: dict[str, ConnectorPoll] = {}
    fingerprint: str = ""  # what the connectors table showed last; a change is reported to the asset
    reported_at: float = 0.0  # when the connectors asset was last recorded by this sensor


ConnectorsEvent = Callable[[Store, str, dg.DagsterInstance, Mapping[str, Sequence[str]]], dg.AssetMaterialization]


def findings_of(result: MonitorResult) -> list[str]:
    """What an operator must know from one poll: source partitions left out because their destination is
    missing (the connector then replicates less than it selects, or nothing)."""
    missing = sorted(result.plan.missing_destination)
    named = [f"{topic}[{partition}]" for topic, partition in missing[:MAX_FINDINGS]]
    if not missing:
        return []
    more = f" (+{len(missing) - MAX_FINDINGS} more)" if len(missing) > MAX_FINDINGS else ""
    return [f"missing at destination, not replicated: {', '.join(named)}{more}"]


def build_kafka_monitor(
    job: dg.JobDefinition,
    *,
    connectors_event: ConnectorsEvent,
    flow_event: Callable[[str, MonitorResult], dg.AssetMaterialization],
    refresh_s: float,
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
        return _evaluate(context, platform.store(), connectors_event, flow_event, refresh_s)

    return kafka_monitor


def _evaluate(
    context: dg.SensorEvaluationContext,
    store: Store,
    connectors_event: ConnectorsEvent,
    flow_event: Callable[[str, MonitorResult], dg.AssetMaterialization],
    refresh_s: float,
) -> dg.SensorResult:
    cursor = MonitorCursor.model_validate_json(context.cursor) if context.cursor else MonitorCursor()
    started = time.monotonic()
    monitor = KafkaMonitor(store)
    run_requests: list[dg.RunRequest] = []
    asset_events: list[dg.AssetMaterialization] = []
    # The partitions are read before the connectors: a connector that `put_connector` stores and registers while
    # this tick runs is then never seen as registered but absent, which would delete its partition for a tick.
    known = set(context.instance.get_dynamic_partitions(CONNECTOR_PARTITIONS))
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
                poll = ConnectorPoll(next_poll_at=now + result.poll_wait_s, findings=findings_of(result))
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
    # Everything the connectors table shows but heartbeat times and lag: a change is recorded at once, and those
    # are kept fresh by recording at least every `refresh_s` while anything runs.
    statuses = store.connector_statuses()
    fingerprint = repr(
        [(s.name, s.state, s.version, s.assignment_generation, [(t.task_id, t.state, t.partitions, t.restart_attempts)
          for t in s.tasks], s.metadata_errors, sorted(s.flow_problems.items()), sorted(s.unhealthy_partitions))
         for s in statuses]
        + [(r.name, r.restart_requested_at) for r in records]
        + sorted((name, poll.error, poll.findings) for name, poll in cursor.polls.items())
    )  # fmt: skip
    running = any(r.state == ConnectorState.RUNNING for r in records)
    changed = fingerprint != cursor.fingerprint
    if changed or (running and time.time() - cursor.reported_at >= refresh_s):
        cursor.fingerprint, cursor.reported_at = fingerprint, time.time()
        findings = {name: poll.findings for name, poll in cursor.polls.items()}
        reason = "monitor saw a change" if changed else "refresh (heartbeats and lag)"
        asset_events.append(connectors_event(store, reason, context.instance, findings))
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
