"""Connectors: their versioned configurations, state, restart requests, and the status view of all."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import (
    and_,
    delete,
    func,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from replicator.assignment import SourcePartition
from replicator.state.base import StoreBase, rowcount
from replicator.state.records import (
    ConnectorHead,
    ConnectorRecord,
    ConnectorState,
    ConnectorStatus,
    PartitionHealth,
    PartitionPauseRow,
    PartitionStatusRow,
    TaskStatus,
    UnknownConnectorError,
)
from replicator.state.schema import (
    Connector,
    ConnectorVersion,
    MetricTotal,
    PartitionPause,
    TopicLags,
)


def _record(row: Connector, config: dict[str, Any]) -> ConnectorRecord:
    return ConnectorRecord(
        name=row.name,
        version=row.version,
        state=ConnectorState(row.state),
        assignment_generation=row.assignment_generation,
        tasks_max=row.tasks_max,
        properties=config,
        restart_requested_at=row.restart_requested_at,
        updated_at=row.updated_at,
    )


def _timestamp(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value is not None else None


# Correlated JSON aggregates keep it to one round trip however many connectors there are.
_STATUS_QUERY = text("""
SELECT c.name, c.state, c.version, c.assignment_generation, cfg.config,
  COALESCE((SELECT json_agg(json_build_object(
        'task_id', a.task_id, 'partitions', jsonb_array_length(a.partitions),
        'state', COALESCE(l.state, 'UNASSIGNED'), 'heartbeat_at', l.heartbeat_at,
        'restart_attempts', COALESCE(l.restart_attempts, 0), 'owner', l.owner, 'error', l.error) ORDER BY a.task_id)
     FROM assignments a LEFT JOIN task_leases l ON l.connector = a.connector AND l.task_id = a.task_id
     WHERE a.connector = c.name AND a.generation = c.assignment_generation), '[]'::json) AS tasks,
  COALESCE((SELECT json_object_agg(s.cluster, s.error)
     FROM (SELECT DISTINCT ON (m.cluster) m.cluster, m.error FROM metadata_snapshots m
           WHERE m.connector = c.name ORDER BY m.cluster, m.id DESC) s
     WHERE s.error IS NOT NULL), '{}'::json) AS metadata_errors,
  COALESCE((SELECT json_agg(json_build_object(
        'topic', p.topic, 'partition', p.partition, 'task_id', p.task_id, 'state', p.state, 'reason', p.reason,
        'updated_at', p.updated_at) ORDER BY p.topic, p.partition)
     FROM partition_status p WHERE p.connector = c.name AND p.state <> 'ACTIVE'), '[]'::json) AS unhealthy,
  COALESCE((SELECT json_agg(json_build_object(
        'topic', q.topic, 'partition', q.partition, 'reason', q.reason, 'paused_at', q.paused_at)
        ORDER BY q.topic, q.partition)
     FROM partition_pauses q WHERE q.connector = c.name), '[]'::json) AS operator_pauses,
  f.source_cluster_id, f.destination_cluster_id, COALESCE(f.problems, '{}'::jsonb) AS flow_problems,
  COALESCE(f.heartbeats, '[]'::jsonb) AS heartbeats, f.acls_mirrored, f.acls_synced_at,
  (SELECT o.positions[1] FROM offsets o WHERE o.connector = c.name AND o.topic = 'heartbeats')
    AS heartbeats_committed
FROM connectors c JOIN connector_configs cfg ON cfg.connector = c.name AND cfg.version = c.version
  LEFT JOIN flows f ON f.connector = c.name
WHERE CAST(:name AS text) IS NULL OR c.name = :name
ORDER BY c.name
""")


class ConnectorStore(StoreBase):
    def put_connector(
        self,
        name: str,
        properties: Mapping[str, Any],
        tasks_max: int,
        initial_state: ConnectorState = ConnectorState.RUNNING,
    ) -> int:
        """Store a new configuration version (creating the connector in `initial_state`); returns the version."""
        with Session(self.engine) as s, s.begin():
            row = s.get(Connector, name, with_for_update=True)
            if row is None:
                row = Connector(name=name, version=1, state=initial_state, tasks_max=tasks_max)
                s.add(row)
            else:
                row.version += 1
                row.tasks_max = tasks_max
                row.updated_at = func.now()
            s.flush()
            s.add(ConnectorVersion(connector=name, version=row.version, config=dict(properties)))
            return row.version

    def get_connector(self, name: str) -> ConnectorRecord:
        with Session(self.engine) as s:
            row = s.execute(
                select(Connector, ConnectorVersion.config)
                .join(
                    ConnectorVersion,
                    and_(ConnectorVersion.connector == Connector.name, ConnectorVersion.version == Connector.version),
                )
                .where(Connector.name == name)
            ).one_or_none()
            if row is None:
                raise UnknownConnectorError(f"connector {name!r} does not exist")
            return _record(row[0], row[1])

    def list_connectors(self) -> list[ConnectorRecord]:
        with Session(self.engine) as s:
            rows = s.execute(
                select(Connector, ConnectorVersion.config)
                .join(
                    ConnectorVersion,
                    and_(ConnectorVersion.connector == Connector.name, ConnectorVersion.version == Connector.version),
                )
                .order_by(Connector.name)
            ).all()
            return [_record(c, cfg) for c, cfg in rows]

    def connector_head(self, name: str) -> ConnectorHead | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(
                    Connector.version,
                    Connector.state,
                    Connector.assignment_generation,
                    Connector.restart_requested_at,
                    Connector.pauses_version,
                ).where(Connector.name == name)
            ).one_or_none()
        return ConnectorHead(row[0], ConnectorState(row[1]), *row[2:]) if row else None

    def set_connector_state(self, name: str, state: ConnectorState) -> None:
        with Session(self.engine) as s, s.begin():
            result = s.execute(
                update(Connector).where(Connector.name == name).values(state=state, updated_at=func.now())
            )
            if rowcount(result) == 0:
                raise UnknownConnectorError(f"connector {name!r} does not exist")

    def request_restart(self, name: str) -> None:
        with Session(self.engine) as s, s.begin():
            result = s.execute(update(Connector).where(Connector.name == name).values(restart_requested_at=func.now()))
            if rowcount(result) == 0:
                raise UnknownConnectorError(f"connector {name!r} does not exist")

    def pause_partition(self, name: str, tp: SourcePartition, reason: str) -> None:
        """Pause one source partition of the connector by hand (again: a new reason), until `resume_partition`."""
        with Session(self.engine) as s, s.begin():
            row = s.get(Connector, name, with_for_update=True)
            if row is None:
                raise UnknownConnectorError(f"connector {name!r} does not exist")
            values = {"connector": name, "topic": tp[0], "partition": tp[1], "reason": reason}
            s.execute(
                insert(PartitionPause)
                .values(values)
                .on_conflict_do_update(
                    index_elements=["connector", "topic", "partition"], set_={"reason": reason, "paused_at": func.now()}
                )
            )
            row.pauses_version += 1

    def resume_partition(self, name: str, tp: SourcePartition) -> bool:
        """Lift an operator's pause of one source partition; whether there was one."""
        with Session(self.engine) as s, s.begin():
            row = s.get(Connector, name, with_for_update=True)
            if row is None:
                raise UnknownConnectorError(f"connector {name!r} does not exist")
            lifted = rowcount(
                s.execute(
                    delete(PartitionPause).where(
                        PartitionPause.connector == name,
                        PartitionPause.topic == tp[0],
                        PartitionPause.partition == tp[1],
                    )
                )
            )
            if lifted:
                row.pauses_version += 1
            return lifted > 0

    def partition_pauses(self, name: str) -> dict[SourcePartition, PartitionPauseRow]:
        """The connector's partitions paused by an operator."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(PartitionPause.topic, PartitionPause.partition, PartitionPause.reason, PartitionPause.paused_at)
                .where(PartitionPause.connector == name)
                .order_by(PartitionPause.topic, PartitionPause.partition)
            ).all()
        return {(r.topic, r.partition): PartitionPauseRow(r.reason, r.paused_at) for r in rows}

    def delete_connector(self, name: str) -> bool:
        """Remove the connector, its versions, assignments, leases, partition status, metric totals and lags.
        Offsets and metric samples are kept (a connector of the same name resumes; reports keep their history)."""
        with Session(self.engine) as s, s.begin():
            s.execute(delete(MetricTotal).where(MetricTotal.connector == name))
            s.execute(delete(TopicLags).where(TopicLags.connector == name))
            return rowcount(s.execute(delete(Connector).where(Connector.name == name))) > 0

    def connector_statuses(self, name: str | None = None) -> list[ConnectorStatus]:
        """Every connector (or only `name`) with its tasks, leases, metadata errors and unhealthy partitions: one
        query."""
        with self.engine.connect() as conn:
            rows = conn.execute(_STATUS_QUERY, {"name": name}).all()
        return [
            ConnectorStatus(
                name=r.name,
                state=ConnectorState(r.state),
                version=r.version,
                assignment_generation=r.assignment_generation,
                properties=r.config,
                tasks=[
                    TaskStatus(
                        t["task_id"],
                        t["partitions"],
                        t["state"],
                        _timestamp(t["heartbeat_at"]),
                        t["restart_attempts"],
                        t["owner"],
                        t["error"],
                    )
                    for t in r.tasks
                ],
                metadata_errors=dict(r.metadata_errors),
                unhealthy_partitions={
                    (p["topic"], p["partition"]): PartitionStatusRow(
                        p["task_id"], PartitionHealth(p["state"]), p["reason"], datetime.fromisoformat(p["updated_at"])
                    )
                    for p in r.unhealthy
                },
                cluster_ids=(r.source_cluster_id, r.destination_cluster_id),
                flow_problems=dict(r.flow_problems),
                heartbeats=list(r.heartbeats),
                heartbeats_committed=r.heartbeats_committed,
                acl_sync=None if r.acls_synced_at is None else (r.acls_mirrored, r.acls_synced_at),
                operator_pauses={
                    (p["topic"], p["partition"]): PartitionPauseRow(p["reason"], datetime.fromisoformat(p["paused_at"]))
                    for p in r.operator_pauses
                },
            )
            for r in rows
        ]
