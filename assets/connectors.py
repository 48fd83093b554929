"""The `connectors` asset: every connector with its state, config version (secrets masked), tasks and problems.

Recorded by the administration jobs after each change and by the monitor sensor whenever it sees one; both get
`connectors_materialization` from `mirus_dagster.definitions` (they never import this package).
"""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg

from mirus_dagster.constants import ASSET_GROUP, CONNECTORS_ASSET, PUT_CONNECTOR_JOB
from replicator.heartbeats import liveness_s
from replicator.masking import mask_properties
from replicator.store import ConnectorStatus, PartitionHealth, Store

connectors_spec = dg.AssetSpec(
    CONNECTORS_ASSET,
    description="Every connector with its state, config version (secrets masked), tasks and paused partitions. "
    "Updated by the administration jobs and whenever the monitor sees a change.",
    group_name=ASSET_GROUP,
)


def _problems(status: ConnectorStatus) -> list[str]:
    problems = [f"{cluster} metadata: {error}" for cluster, error in sorted(status.metadata_errors.items())]
    problems += [f"{duty}: {reason}" for duty, reason in sorted(status.flow_problems.items())]
    return problems + [
        f"{topic}[{partition}] {row.state}: {row.reason}"
        for (topic, partition), row in sorted(status.unhealthy_partitions.items())
        if row.state != PartitionHealth.ACTIVE
    ]


def _tasks(status: ConnectorStatus, now: datetime) -> list[str]:
    lines = []
    for task in status.tasks:
        age = f"{(now - task.heartbeat_at).total_seconds():.0f}s ago" if task.heartbeat_at else "never"
        lines.append(f"{task.task_id}: {task.state} ({task.partitions} partitions, heartbeat {age}, "
                     f"restarts {task.restart_attempts})")  # fmt: skip
    return lines


def connectors_markdown(statuses: list[ConnectorStatus]) -> str:
    if not statuses:
        return f"No connectors. Add one with the `{PUT_CONNECTOR_JOB}` job."
    now = datetime.now(UTC)
    lines = [
        "| connector | state | clusters (ids) | flow liveness | version | generation | partitions | tasks "
        "| restarts | problems |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in statuses:
        tasks = "<br>".join(_tasks(s, now)) or "none assigned"
        problems = "<br>".join(_problems(s)) or "—"
        restarts = sum(t.restart_attempts for t in s.tasks)
        clusters = " → ".join(cluster or "?" for cluster in s.cluster_ids)
        age = liveness_s(s.heartbeats, s.heartbeats_committed)
        liveness = "—" if age is None else f"{age:.0f}s"
        lines.append(f"| {s.name} | {s.state} | {clusters} | {liveness} | {s.version} | {s.assignment_generation} "
                     f"| {sum(t.partitions for t in s.tasks)} | {tasks} | {restarts} | {problems} |")  # fmt: skip
    return "\n".join(lines)


def connectors_materialization(store: Store, reason: str) -> dg.AssetMaterialization:
    """The asset as it is now (one query), recorded with `reason` as its description."""
    statuses = store.connector_statuses()
    configs = {s.name: mask_properties(s.properties) for s in statuses}
    return dg.AssetMaterialization(
        asset_key=CONNECTORS_ASSET,
        description=reason,
        metadata={
            "connectors": dg.MetadataValue.md(connectors_markdown(statuses)),
            "configs (secrets masked)": dg.MetadataValue.json(configs),
            "count": len(statuses),
        },
    )
