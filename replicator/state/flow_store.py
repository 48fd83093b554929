"""What the monitor keeps per connector: metadata snapshots, the flow (cluster ids, duties, heartbeats, problems) and
group checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    func,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from replicator.state.base import StoreBase, typed_row
from replicator.state.records import CheckpointRow, FlowRow, SnapshotRow
from replicator.state.schema import (
    Checkpoint,
    Connector,
    Flow,
    MetadataSnapshot,
)


class FlowStore(StoreBase):
    def record_snapshot(
        self, connector: str | None, cluster: str, topics: Mapping[str, int], error: str | None
    ) -> bool:
        """Keep what a monitor saw, only when it differs from the previous observation. Returns whether stored."""
        with Session(self.engine) as s, s.begin():
            last = s.execute(
                select(MetadataSnapshot.topics, MetadataSnapshot.error)
                .where(MetadataSnapshot.connector == connector, MetadataSnapshot.cluster == cluster)
                .order_by(MetadataSnapshot.id.desc())
                .limit(1)
            ).one_or_none()
            if last is not None and last.topics == dict(topics) and last.error == error:
                return False
            s.add(MetadataSnapshot(connector=connector, cluster=cluster, topics=dict(topics), error=error))
            return True

    def latest_snapshot(self, connector: str, cluster: str) -> SnapshotRow | None:
        with Session(self.engine) as s:
            row = s.scalars(
                select(MetadataSnapshot)
                .where(MetadataSnapshot.connector == connector, MetadataSnapshot.cluster == cluster)
                .order_by(MetadataSnapshot.id.desc())
                .limit(1)
            ).one_or_none()
            return typed_row(SnapshotRow, row) if row else None

    def source_topics_seen(self) -> list[tuple[str, str]]:
        """Every (connector, topic) a snapshot of a connector's source cluster has shown."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT DISTINCT connector, jsonb_object_keys(topics) FROM metadata_snapshots"
                    " WHERE cluster = 'source' AND connector IS NOT NULL"
                )
            )
            return [(connector, topic) for connector, topic in rows]

    def snapshot_topics(self, start: datetime, end: datetime, rows: int) -> Iterator[list[dict[str, Any]]]:
        """The snapshots taken in [start, end), by id, a row per snapshot and topic (snapshot_id, connector, cluster,
        taken_at, error, topic, partitions), streamed `rows` at a time."""
        # A snapshot without topics (a metadata error) keeps one row with a null topic so its error is not lost.
        query = text(
            "SELECT s.id AS snapshot_id, s.connector, s.cluster, s.taken_at, s.error, t.key AS topic,"
            " t.value::int AS partitions FROM metadata_snapshots s"
            " LEFT JOIN LATERAL jsonb_each_text(s.topics) t ON true"
            " WHERE s.taken_at >= :start AND s.taken_at < :end ORDER BY s.id"
        )
        with self.engine.connect().execution_options(stream_results=True) as conn:
            result = conn.execute(query, {"start": start, "end": end})
            while chunk := result.mappings().fetchmany(rows):
                yield [dict(r) for r in chunk]

    def snapshot_hours(self, before: datetime) -> list[datetime]:
        """The hours (UTC) of the snapshots taken before `before`."""
        with self.engine.connect() as conn:
            hours = conn.scalars(
                text(
                    "SELECT DISTINCT date_trunc('hour', taken_at AT TIME ZONE 'UTC') FROM metadata_snapshots"
                    " WHERE taken_at < :cutoff"
                ),
                {"cutoff": before},
            )
            return [h.replace(tzinfo=UTC) for h in hours]

    def delete_snapshots(self, before: datetime, hours: Sequence[datetime]) -> int:
        """Delete the snapshots taken before `before` in `hours` (UTC), but never the latest of a connector and
        cluster: the monitor compares against it. Returns how many."""
        with self.engine.begin() as conn:
            return conn.execute(
                text(
                    "DELETE FROM metadata_snapshots WHERE taken_at < :cutoff"
                    " AND date_trunc('hour', taken_at AT TIME ZONE 'UTC') = ANY(:hours)"
                    " AND id NOT IN (SELECT max(id) FROM metadata_snapshots GROUP BY connector, cluster)"
                ),
                {"cutoff": before, "hours": [h.astimezone(UTC).replace(tzinfo=None) for h in hours]},
            ).rowcount

    def flow(self, connector: str) -> FlowRow:
        """The connector's flow (an empty one before the monitor's first poll)."""
        with Session(self.engine) as s:
            row = s.get(Flow, connector)
            return typed_row(FlowRow, row) if row else FlowRow()

    def destination_cluster_ids(self) -> set[str]:
        """The Kafka cluster ids of the connectors' destinations, as the metadata watcher recorded them."""
        with self.engine.connect() as conn:
            query = select(Flow.destination_cluster_id).where(Flow.destination_cluster_id.is_not(None)).distinct()
            return {cluster for cluster in conn.scalars(query) if cluster is not None}

    def update_flow(self, connector: str, **values: Any) -> None:
        """Create or update the connector's `flows` row with `values` (column -> value)."""
        with Session(self.engine) as s, s.begin():
            stmt = insert(Flow).values(connector=connector, **values)
            s.execute(
                stmt.on_conflict_do_update(index_elements=[Flow.connector], set_={**values, "updated_at": func.now()})
            )

    def update_flows(self, values: Mapping[str, Mapping[str, Any]]) -> None:
        """`update_flow` for many connectors in one transaction (a watcher round's duties: one commit, not one per
        connector)."""
        if not values:
            return
        with Session(self.engine) as s, s.begin():
            # A connector deleted since its poll has no flow to keep (and its row would break the foreign key).
            existing = set(
                s.scalars(select(Connector.name).where(Connector.name.in_(list(values))).with_for_update(read=True))
            )
            for connector in sorted(existing):  # a fixed order: two writers never lock rows in opposite orders
                stmt = insert(Flow).values(connector=connector, **values[connector])
                s.execute(
                    stmt.on_conflict_do_update(
                        index_elements=[Flow.connector], set_={**values[connector], "updated_at": func.now()}
                    )
                )

    def save_checkpoints(self, connector: str, group_id: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Store a group's translated offsets (keys: topic, partition, source_offset, destination_topic,
        destination_partition, destination_offset), replacing earlier ones for the same partitions."""
        if not rows:
            return
        with Session(self.engine) as s, s.begin():
            stmt = insert(Checkpoint).values([{"connector": connector, "group_id": group_id, **r} for r in rows])
            columns = ("source_offset", "destination_topic", "destination_partition", "destination_offset")
            s.execute(
                stmt.on_conflict_do_update(
                    index_elements=[Checkpoint.connector, Checkpoint.group_id, Checkpoint.topic, Checkpoint.partition],
                    set_={**{c: stmt.excluded[c] for c in columns}, "updated_at": func.now()},
                )
            )

    def checkpoints(self, connector: str, group_id: str | None = None) -> list[CheckpointRow]:
        query = select(Checkpoint).where(Checkpoint.connector == connector)
        if group_id is not None:
            query = query.where(Checkpoint.group_id == group_id)
        with Session(self.engine) as s:
            rows = s.scalars(query.order_by(Checkpoint.group_id, Checkpoint.topic, Checkpoint.partition))
            return [typed_row(CheckpointRow, r) for r in rows]
