"""The supervisor sensor: failed, crashed or silent replicator tasks get a new run, with backoff.

Built by `build_task_supervisor` from the job it launches. A tick reads the store and the Dagster instance only:
stored configs are loaded (`replicator.configuration.connector.load`) without creating any Kafka client.
"""

from datetime import UTC, datetime

import dagster as dg

from mirus_dagster.constants import ENV_TASK_AUTO_RESTART, SUPERVISOR_SENSOR
from mirus_dagster.dagster_resources import PlatformDatabase, SupervisorPolicy
from mirus_dagster.run_launchers import replicator_launcher_tags
from replicator.configuration.connector import ConnectorConfigError, load
from replicator.state.records import ConnectorState
from sensors.decisions import Decision, requested_restart, restart_decision
from sensors.task_runs import (
    live_runs,
    task_histories,
    task_run_requests,
    worker_histories,
    worker_run_request,
)


def build_task_supervisor(
    job: dg.JobDefinition, worker_job: dg.JobDefinition | None = None, workers: int = 0
) -> dg.SensorDefinition:
    """The sensor restarting `job` (the replicator) runs of failed, crashed or silent tasks; with `workers` > 0, the
    failed runs of `worker_job` (a worker restarts the tasks it hosts itself)."""
    if workers and worker_job is None:
        raise ValueError("workers need the worker job")

    @dg.sensor(
        name=SUPERVISOR_SENSOR,
        jobs=[job, *([worker_job] if worker_job else [])],
        minimum_interval_seconds=1,  # the daemon's 5 s loop is the real interval (see sensors/run_starter.py)
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Restart replicator tasks whose run failed or crashed (doubling backoff, capped), and replace runs "
            "whose task stopped heartbeating; the new run's lease fences the old one. Restarts are counted per task."
        ),
    )
    def task_supervisor(
        context: dg.SensorEvaluationContext, platform: PlatformDatabase, supervisor: SupervisorPolicy
    ) -> dg.SensorResult | dg.SkipReason:
        store = platform.store()
        now = datetime.now(UTC)
        run_requests = _worker_restarts(context, supervisor, workers, now) if workers else []
        for record in store.list_connectors() if not workers else ():
            if record.state != ConnectorState.RUNNING:
                continue
            try:
                config = load(record.properties)
            except ConnectorConfigError:
                continue
            histories = task_histories(context.instance, record.name)
            for task_id in sorted(store.read_assignment(record.name)):
                history = histories.get(task_id)
                if history is None:
                    continue  # never ran: the run starter starts it
                lease = store.lease_of(record.name, task_id)
                if requested_restart(history, record.restart_requested_at):
                    decision = Decision(True, "an operator requested a restart", runs=1 + config.task_standby_runs)
                elif not supervisor.auto_restart:
                    continue
                else:
                    decision = restart_decision(
                        history,
                        lease.heartbeat_at if lease else None,
                        now,
                        wanted=1 + config.task_standby_runs,
                        lease_timeout_s=config.task_lease_timeout_ms / 1000,
                        initial_backoff_s=supervisor.initial_backoff_s,
                        max_backoff_s=supervisor.max_backoff_s,
                    )
                if not decision.launch:
                    continue
                if decision.replace_live_run:
                    for run in live_runs(context.instance, record.name, task_id):
                        context.instance.report_run_failed(run, f"replaced by the supervisor: {decision.reason}")
                attempts = store.record_restart(record.name, task_id)
                context.log.info(f"restarting {record.name}-{task_id} (attempt {attempts}): {decision.reason}")
                live = 0 if decision.replace_live_run else history.live_runs
                run_requests += task_run_requests(
                    record.name,
                    task_id,
                    f"restart: {decision.reason}",
                    decision.runs,
                    live,
                    replicator_launcher_tags(context.instance),
                )
        if not run_requests and not supervisor.auto_restart:
            return dg.SkipReason(
                f"automatic restarts are turned off ({ENV_TASK_AUTO_RESTART}=false); only requested ones are made"
            )
        return dg.SensorResult(run_requests=run_requests)

    return task_supervisor


def _worker_restarts(
    context: dg.SensorEvaluationContext, supervisor: SupervisorPolicy, workers: int, now: datetime
) -> list[dg.RunRequest]:
    """New runs for the workers whose last run failed and none is live, after the same backoff as a task's.

    A worker has no lease of its own (its tasks do, and a standby on another worker takes each over at once), so a
    live worker run is never replaced here; one whose process died is marked failed by Dagster's run monitoring."""
    if not supervisor.auto_restart:
        return []
    run_requests = []
    for worker, history in sorted(worker_histories(context.instance, workers).items()):
        if worker >= workers or history.live:
            continue
        decision = restart_decision(
            history,
            None,
            now,
            lease_timeout_s=0.0,
            initial_backoff_s=supervisor.initial_backoff_s,
            max_backoff_s=supervisor.max_backoff_s,
        )
        if decision.launch:
            context.log.info(f"restarting worker {worker} of {workers}: {decision.reason}")
            tags = replicator_launcher_tags(context.instance, worker=True)
            run_requests.append(worker_run_request(worker, workers, f"restart: {decision.reason}", tags))
    return run_requests
