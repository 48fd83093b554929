"""Replicator runs as seen in the Dagster instance, found by tags (not run keys): one run per task, or (with
MIRUS_REPLICATOR_WORKERS) worker runs hosting many tasks each."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import dagster as dg

from mirus_dagster.constants import (
    HOST_TASKS_OP,
    KIND_REPLICATOR,
    REPLICATE_OP,
    REPLICATOR_JOB,
    TAG_CONNECTOR,
    TAG_KIND,
    TAG_REASON,
    TAG_TASK,
    TAG_WORKER,
    TAG_WORKERS,
    WORKER_JOB,
)
from sensors.decisions import TaskRunHistory, failure_streak

LIVE = {
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
}
HISTORY_LIMIT = 200


def replicator_tags(connector: str, task_id: int) -> dict[str, str]:
    return {TAG_KIND: KIND_REPLICATOR, TAG_CONNECTOR: connector, TAG_TASK: str(task_id)}


# Dagster's run queue launches higher priorities first (default 0). Standbys come after every task's first run:
# under the queue's replicator limit, a task must never wait behind another task's standby.
STANDBY_PRIORITY = "-1"
PRIORITY_TAG = "dagster/priority"


def run_request(
    connector: str, task_id: int, reason: str, standby: bool = False, launcher_tags: Mapping[str, str] | None = None
) -> dg.RunRequest:
    """A run of the task; `launcher_tags`: what the run launcher in use needs (`replicator_launcher_tags`)."""
    tags = {**(launcher_tags or {}), **replicator_tags(connector, task_id), TAG_REASON: reason}
    if standby:
        tags[PRIORITY_TAG] = STANDBY_PRIORITY
    return dg.RunRequest(
        job_name=REPLICATOR_JOB,
        run_config={"ops": {REPLICATE_OP: {"config": {"connector": connector, "task_id": task_id}}}},
        tags=tags,
    )


def task_run_requests(
    connector: str,
    task_id: int,
    reason: str,
    runs: int,
    live: int,
    launcher_tags: Mapping[str, str] | None = None,
) -> list[dg.RunRequest]:
    """`runs` new runs of a task that has `live` runs: the first is queued as the task's owner if none is live,
    the others as standbys (after every task's first run)."""
    return [run_request(connector, task_id, reason, live + i > 0, launcher_tags) for i in range(runs)]


def worker_run_request(
    worker: int, workers: int, reason: str, launcher_tags: Mapping[str, str] | None = None
) -> dg.RunRequest:
    """A run of worker `worker` of `workers`."""
    tags = {
        **(launcher_tags or {}),
        TAG_KIND: KIND_REPLICATOR,
        TAG_WORKER: str(worker),
        TAG_WORKERS: str(workers),
        TAG_REASON: reason,
    }
    return dg.RunRequest(
        job_name=WORKER_JOB,
        run_config={"ops": {HOST_TASKS_OP: {"config": {"worker": worker, "workers": workers}}}},
        tags=tags,
    )


def _ts(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, UTC) if value is not None else None


def _lived_s(record: dg.RunRecord) -> float | None:
    if record.start_time is None or record.end_time is None:
        return None
    return record.end_time - record.start_time


def task_histories(instance: dg.DagsterInstance, connector: str) -> dict[int, TaskRunHistory]:
    """Per task id of `connector`, its recent runs folded into a `TaskRunHistory`. One query per connector."""
    records = instance.get_run_records(
        dg.RunsFilter(job_name=REPLICATOR_JOB, tags={TAG_CONNECTOR: connector}), limit=HISTORY_LIMIT
    )
    return _histories(records, TAG_TASK)


def worker_histories(instance: dg.DagsterInstance, workers: int) -> dict[int, TaskRunHistory]:
    """Per worker index, the recent runs started for an estate of `workers` workers. One query."""
    records = instance.get_run_records(
        dg.RunsFilter(job_name=WORKER_JOB, tags={TAG_WORKERS: str(workers)}), limit=HISTORY_LIMIT
    )
    return _histories(records, TAG_WORKER)


def _histories(records: Sequence[dg.RunRecord], tag: str) -> dict[int, TaskRunHistory]:
    """`records` (newest first) grouped by the number in their `tag`, each group folded into a `TaskRunHistory`."""
    by_task: dict[int, list[dg.RunRecord]] = defaultdict(list)
    for record in records:
        task = record.dagster_run.tags.get(tag)
        if task is not None and task.isdigit():
            by_task[int(task)].append(record)
    histories = {}
    for task_id, runs in by_task.items():
        live = [r for r in runs if r.dagster_run.status in LIVE]
        done = [r for r in runs if r.dagster_run.status not in LIVE]
        failures = failure_streak((r.dagster_run.status.value, _lived_s(r)) for r in done)
        histories[task_id] = TaskRunHistory(
            live_runs=len(live),
            live_started_at=_ts(live[0].start_time) if live else None,
            latest_status=done[0].dagster_run.status.value if done else None,
            latest_ended_at=_ts(done[0].end_time or done[0].update_timestamp.timestamp()) if done else None,
            consecutive_failures=failures,
            latest_lived_s=_lived_s(done[0]) if done else None,
        )
    return histories


def live_runs(instance: dg.DagsterInstance, connector: str, task_id: int) -> list[dg.DagsterRun]:
    return list(
        instance.get_runs(
            dg.RunsFilter(job_name=REPLICATOR_JOB, statuses=list(LIVE), tags=replicator_tags(connector, task_id))
        )
    )


NEVER_RAN = TaskRunHistory(0, None, None, None, 0)
