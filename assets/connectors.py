"""The `connectors` asset: every connector as an operator needs to see it, now.

Per connector: its state and whether it replicates anything, its tasks with their run, lease state and last
heartbeat, its partitions, lag, flow liveness (heartbeat records) and clusters, and its problems (replicator and
admin runs that failed in the last hour, metadata errors, flow duties that failed, partitions paused by an
operator with the reason, paused or dropped partitions, source partitions whose destination is missing, nothing to
replicate); for connectors on copy.mode=batches, how many records went as batches and by records, and why the
batch path handed partitions back to the record path. Recorded by the administration jobs after each change, by
the run_starter sensor whenever what it shows changes and at least every `REFRESH_S` while anything runs, and by
the run-failure sensor when a run fails; times are absolute (UTC), so an older view never pretends to be current.
Its size is bounded whatever the estate holds: long property values and long lists are cut with a count of what
was left out.

Every recorder gets `connectors_materialization` from `mirus_dagster.definitions` (they never import this package).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg

from mirus_dagster.constants import (
    ASSET_GROUP,
    CONNECTORS_ASSET,
    KIND_ADMIN,
    KIND_REPLICATOR,
    PUT_CONNECTOR_JOB,
    REPLICATOR_JOB,
    TAG_CONNECTOR,
    TAG_KIND,
    TAG_TASK,
)
from replicator.configuration.masking import mask_properties
from replicator.discovery.heartbeats import liveness_s
from replicator.engine.metrics import HAND_BACK_REASONS
from replicator.state.records import (
    LEASE_HELD,
    OPERATOR_PAUSE,
    ConnectorState,
    ConnectorStatus,
    PartitionHealth,
    TaskStatus,
    TopicTotals,
)
from replicator.state.store import Store

REFRESH_S = 60.0
MAX_CONNECTORS = 100  # rows in the table; the rest are counted
MAX_LINES = 10  # problems or tasks listed per connector; the rest are counted
MAX_VALUE_CHARS = 200  # a property value shown longer than this is cut
FAILURES_SHOWN_FOR = timedelta(hours=1)  # a failed run stays among its connector's problems this long
MAX_FAILURES_READ = 200
LIVE_RUN_STATUSES = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]

connectors_spec = dg.AssetSpec(
    CONNECTORS_ASSET,
    description="Every connector: state, tasks with their run and heartbeat, partitions, lag and problems "
    "(missing destinations included). Recorded after every change and at least every minute while tasks run.",
    group_name=ASSET_GROUP,
)


def _clock(at: datetime | None) -> str:
    return at.astimezone(UTC).strftime("%H:%M:%S UTC") if at else "never"


def _capped(lines: Sequence[str], limit: int = MAX_LINES) -> list[str]:
    return list(lines[:limit]) + ([f"(+{len(lines) - limit} more)"] if len(lines) > limit else [])


def live_replicator_runs(instance: dg.DagsterInstance) -> dict[tuple[str, int], str]:
    """(connector, task) → id of its live replicator run: one query for the whole estate."""
    runs = instance.get_runs(
        dg.RunsFilter(job_name=REPLICATOR_JOB, statuses=LIVE_RUN_STATUSES, tags={TAG_KIND: KIND_REPLICATOR})
    )
    found: dict[tuple[str, int], str] = {}
    for run in runs:
        connector, task = run.tags.get(TAG_CONNECTOR), run.tags.get(TAG_TASK, "")
        if connector and task.isdigit():
            found.setdefault((connector, int(task)), run.run_id)
    return found


def recent_failures(instance: dg.DagsterInstance, now: datetime) -> dict[str, list[str]]:
    """Connector → its replicator and admin runs that failed within `FAILURES_SHOWN_FOR`, newest first: one query."""
    records = instance.get_run_records(
        dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE], updated_after=now - FAILURES_SHOWN_FOR),
        limit=MAX_FAILURES_READ,
    )
    failures: dict[str, list[str]] = {}
    for record in records:
        run = record.dagster_run
        connector, kind = run.tags.get(TAG_CONNECTOR), run.tags.get(TAG_KIND)
        if not connector or kind not in (KIND_REPLICATOR, KIND_ADMIN):
            continue
        task = f" task {run.tags[TAG_TASK]}" if TAG_TASK in run.tags else ""
        at = f" at {_clock(datetime.fromtimestamp(record.end_time, UTC))}" if record.end_time else ""
        failures.setdefault(connector, []).append(
            f"run [{run.run_id[:8]}](/runs/{run.run_id}) of {run.job_name}{task} failed{at}"
        )
    return failures


def _owner_run(task: TaskStatus) -> str | None:
    """The run holding the task's lease, from its owner (host:pid:run id): a worker run hosting many tasks has no
    tags naming them."""
    run_id = task.owner.rsplit(":", 1)[-1] if task.owner and task.state == LEASE_HELD else ""
    return run_id if len(run_id) == 36 and run_id.count("-") == 4 else None


def _tasks(status: ConnectorStatus, runs: Mapping[tuple[str, int], str]) -> list[str]:
    lines = []
    for task in status.tasks:
        run_id = runs.get((status.name, task.task_id)) or _owner_run(task)
        run = f"run [{run_id[:8]}](/runs/{run_id})" if run_id else "no run"
        lines.append(
            f"{task.task_id}: {task.state} ({task.partitions} partitions, {run}, "
            f"heartbeat {_clock(task.heartbeat_at)}, restarts {task.restart_attempts})"
        )
    return lines


def _problems(status: ConnectorStatus, findings: Sequence[str]) -> list[str]:
    problems = [f"{cluster} metadata: {error}" for cluster, error in sorted(status.metadata_errors.items())]
    problems += [f"{duty}: {reason}" for duty, reason in sorted(status.flow_problems.items())]
    problems += [
        f"{topic}[{partition}] {OPERATOR_PAUSE} at {_clock(row.paused_at)}: {row.reason}"
        for (topic, partition), row in sorted(status.operator_pauses.items())
    ]
    problems += [
        f"{topic}[{partition}] {row.state}: {row.reason}"
        for (topic, partition), row in sorted(status.unhealthy_partitions.items())
        if row.state != PartitionHealth.ACTIVE
    ]
    problems += findings
    if status.state == ConnectorState.RUNNING and not any(t.partitions for t in status.tasks):
        problems.append("replicates nothing: no source partition is assigned")
    return problems


def _lag(lags: Mapping[tuple[str, int], int | None]) -> str:
    if not lags:
        return "—"
    known = [lag for lag in lags.values() if lag is not None]
    if len(known) < len(lags):
        return "unknown" if not known else f"≥ {sum(known)} ({len(lags) - len(known)} partitions unknown)"
    return str(sum(known))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def connectors_markdown(
    statuses: Sequence[ConnectorStatus],
    runs: Mapping[tuple[str, int], str],
    lags: Mapping[str, Mapping[tuple[str, int], int | None]],
    findings: Mapping[str, Sequence[str]],
    now: datetime,
) -> str:
    if not statuses:
        return f"No connectors. Add one with the `{PUT_CONNECTOR_JOB}` job."
    lines = [
        f"As of {_clock(now)}.",
        "",
        "| connector | state | partitions | lag | flow liveness | clusters (ids) | version | restarts | tasks "
        "| problems |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in statuses[:MAX_CONNECTORS]:
        # Dagster's markdown shows no line breaks inside a table cell: list items are separated by "; ".
        tasks = "; ".join(_cell(t) for t in _capped(_tasks(s, runs))) or "none assigned"
        problems = "; ".join(_cell(p) for p in _capped(_problems(s, findings.get(s.name, ())))) or "—"
        clusters = " → ".join(cluster or "?" for cluster in s.cluster_ids)
        if s.acl_sync is not None:
            clusters += f"; topic ACLs: {s.acl_sync[0]} mirrored at {_clock(s.acl_sync[1])}"
        age = liveness_s(s.heartbeats, s.heartbeats_committed)
        liveness = "—" if age is None else f"{age:.0f}s"
        lines.append(
            f"| {_cell(s.name)} | {s.state} | {sum(t.partitions for t in s.tasks)} "
            f"| {_lag(lags.get(s.name, {}))} | {liveness} | {_cell(clusters)} | {s.version} "
            f"| {sum(t.restart_attempts for t in s.tasks)} | {tasks} | {problems} |"
        )
    if len(statuses) > MAX_CONNECTORS:
        lines += ["", f"(+{len(statuses) - MAX_CONNECTORS} more connectors)"]
    return "\n".join(lines)


def batches_markdown(statuses: Sequence[ConnectorStatus], totals: Sequence[TopicTotals]) -> str | None:
    """Per connector on copy.mode=batches (or that copied batches before), the records copied each way and the batch
    path's hand-backs to the record path by reason (as `mirus_batch_hand_backs_total` counts them); None if none."""
    records: Counter[str] = Counter()
    as_batches: Counter[str] = Counter()
    reasons: dict[str, Counter[str]] = {}
    for t in totals:
        records[t.connector] += t.records
        as_batches[t.connector] += t.batch_records
        reasons.setdefault(t.connector, Counter()).update(t.handed_back)
    shown = [
        s.name
        for s in statuses
        if str(s.properties.get("copy.mode", "")).strip() == "batches" or as_batches[s.name] or reasons.get(s.name)
    ]
    if not shown:
        return None
    lines = [
        "Records copied as record batches and by the record path, and partitions handed back to the record path "
        "(by reason; docs/MONITORING.md).",
        "",
        f"| connector | as batches | by records | {' | '.join(HAND_BACK_REASONS)} |",
        "|---|---|---|" + "---|" * len(HAND_BACK_REASONS),
    ]
    for name in shown:
        counts = reasons.get(name, Counter())
        lines.append(
            f"| {_cell(name)} | {as_batches[name]} | {records[name] - as_batches[name]} | "
            + " | ".join(str(counts[reason]) for reason in HAND_BACK_REASONS)
            + " |"
        )
    return "\n".join(lines)


def _shown_config(properties: Mapping[str, Any]) -> dict[str, Any]:
    shown = {}
    for key, value in mask_properties(properties).items():
        if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
            value = f"{value[:MAX_VALUE_CHARS]}… ({len(value)} characters)"
        shown[key] = value
    return shown


def connectors_materialization(
    store: Store,
    reason: str,
    instance: dg.DagsterInstance,
    findings: Mapping[str, Sequence[str]] | None = None,
) -> dg.AssetMaterialization:
    """The asset as it is now, recorded with `reason` as its description. `findings`: per connector, what the
    monitor found on its last look (e.g. partitions missing at the destination)."""
    statuses = store.connector_statuses()
    shown = statuses[:MAX_CONNECTORS]
    lags = {s.name: store.partition_lags(s.name) for s in shown}
    now = datetime.now(UTC)
    shown_findings = {name: list(lines) for name, lines in (findings or {}).items()}
    for name, failed in recent_failures(instance, now).items():
        shown_findings[name] = [*failed, *shown_findings.get(name, [])]
    table = connectors_markdown(statuses, live_replicator_runs(instance), lags, shown_findings, now)
    metadata: dict[str, Any] = {"connectors": dg.MetadataValue.md(table)}
    batches = batches_markdown(shown, store.topic_totals())
    if batches is not None:
        metadata["copy.mode=batches"] = dg.MetadataValue.md(batches)
    metadata["configs (secrets masked)"] = dg.MetadataValue.json({s.name: _shown_config(s.properties) for s in shown})
    metadata["count"] = len(statuses)
    return dg.AssetMaterialization(asset_key=CONNECTORS_ASSET, description=reason, metadata=metadata)
