"""The estate's state as Dagster metadata: connectors, their tasks and partitions, secrets masked."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg

from replicator.config import mask_properties
from replicator.store import Store

CONNECTORS_ASSET = dg.AssetKey("connectors")


def connector_rows(store: Store) -> list[dict[str, object]]:
    """One row per connector: state, versions, tasks with lease state and restarts, paused partitions."""
    now = datetime.now(UTC)
    rows = []
    for record in store.list_connectors():
        assignment = store.read_assignment(record.name)
        tasks = []
        restarts = 0
        for task_id in sorted(assignment):
            lease = store.lease_of(record.name, task_id) or {}
            restarts += lease.get("restart_attempts", 0)
            beat = lease.get("heartbeat_at")
            age = f"{(now - beat).total_seconds():.0f}s ago" if beat else "never"
            tasks.append(f"{task_id}: {lease.get('state', 'UNASSIGNED')} ({len(assignment[task_id])} partitions, "
                         f"heartbeat {age}, restarts {lease.get('restart_attempts', 0)})")  # fmt: skip
        problems = [
            f"{cluster} metadata: {snapshot['error']}"
            for cluster in ("source", "destination")
            if (snapshot := store.latest_snapshot(record.name, cluster)) and snapshot["error"]
        ]
        problems += [
            f"{topic}[{partition}] {status['state']}: {status['reason']}"
            for (topic, partition), status in sorted(store.partition_statuses(record.name).items())
            if status["state"] != "ACTIVE"
        ]
        rows.append({
            "name": record.name, "state": record.state, "version": record.version,
            "generation": record.assignment_generation, "tasks": tasks, "restarts": restarts,
            "partitions": sum(len(p) for p in assignment.values()), "problems": problems,
            "config": mask_properties(record.properties),
        })  # fmt: skip
    return rows


def connectors_markdown(rows: list[dict[str, object]]) -> str:
    if not rows:
        return "No connectors. Add one with the `put_connector` job."
    lines = [
        "| connector | state | version | generation | partitions | tasks | restarts | problems |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tasks = "<br>".join(r["tasks"]) or "none assigned"  # type: ignore[arg-type]
        problems = "<br>".join(r["problems"]) or "—"  # type: ignore[arg-type]
        lines.append(f"| {r['name']} | {r['state']} | {r['version']} | {r['generation']} | {r['partitions']} "
                     f"| {tasks} | {r['restarts']} | {problems} |")  # fmt: skip
    return "\n".join(lines)


def connectors_materialization(store: Store, reason: str) -> dg.AssetMaterialization:
    rows = connector_rows(store)
    return dg.AssetMaterialization(
        asset_key=CONNECTORS_ASSET,
        description=reason,
        metadata={
            "connectors": dg.MetadataValue.md(connectors_markdown(rows)),
            "configs (secrets masked)": dg.MetadataValue.json({r["name"]: r["config"] for r in rows}),
            "count": len(rows),
        },
    )
