"""Offsets: each partition's next source offset (and where its next copy goes at the destination), written only under
the lease's epoch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    delete,
    func,
    select,
    text,
)
from sqlalchemy.orm import Session

from replicator.assignment import SourcePartition
from replicator.state.base import StoreBase, array_literal, by_topic_order
from replicator.state.records import (
    LEASE_HELD,
    ConnectorNotStoppedError,
    ConnectorState,
    CopySegment,
    Lease,
    TasksStillStoppingError,
    UnknownConnectorError,
)
from replicator.state.schema import (
    Connector,
    Offset,
    TaskLease,
)
from replicator.state.segment_store import write_segments

# Every changed partition of a commit in one statement: per topic, an array with the new offsets at their partitions
# and NULL elsewhere, merged into the stored array element by element (a NULL keeps the stored value; the longer
# array sets the length). An array without a NULL that is as long as the stored one replaces it as it is (a busy
# topic's every partition moved: no merge to compute). Rows come in topic order, so two tasks sharing topics never
# lock them in opposite orders.
_MERGE_OFFSETS = text("""
INSERT INTO offsets AS o (connector, topic, positions, destination_positions, epoch, updated_at)
SELECT :connector, u.topic, CAST(u.positions AS bigint[]), CAST(u.destinations AS bigint[]), :epoch, now()
FROM unnest(CAST(:topics AS text[]), CAST(:positions AS text[]), CAST(:destinations AS text[]))
  AS u(topic, positions, destinations)
ON CONFLICT (connector, topic) DO UPDATE SET
  positions = CASE
    WHEN array_position(excluded.positions, NULL) IS NULL
         AND cardinality(excluded.positions) >= cardinality(o.positions) THEN excluded.positions
    ELSE (SELECT array_agg(coalesce(n, s) ORDER BY i)
          FROM unnest(o.positions, excluded.positions) WITH ORDINALITY AS m(s, n, i)) END,
  destination_positions = CASE
    WHEN excluded.destination_positions IS NULL THEN o.destination_positions
    WHEN array_position(excluded.destination_positions, NULL) IS NULL
         AND cardinality(excluded.destination_positions) >= coalesce(cardinality(o.destination_positions), 0)
      THEN excluded.destination_positions
    ELSE (SELECT array_agg(coalesce(n, s) ORDER BY i)
          FROM unnest(o.destination_positions, excluded.destination_positions) WITH ORDINALITY AS m(s, n, i)) END,
  epoch = excluded.epoch, updated_at = now()
""")


def _topic_arrays(
    offsets: Mapping[SourcePartition, int], destinations: Mapping[SourcePartition, int]
) -> dict[str, Any]:
    """`_MERGE_OFFSETS`'s parameters."""
    by_topic = by_topic_order(offsets)
    ends = []
    for topic, changed in by_topic.items():
        own = {p: destinations[(topic, p)] for p in changed if (topic, p) in destinations}
        ends.append(array_literal(own) if own else None)
    return {"topics": list(by_topic), "positions": [array_literal(c) for c in by_topic.values()], "destinations": ends}


class OffsetStore(StoreBase):
    def commit(
        self,
        lease: Lease,
        offsets: Mapping[SourcePartition, int],
        destination_offsets: Mapping[SourcePartition, int] | None = None,
        segments: Iterable[CopySegment] = (),
    ) -> None:
        """Heartbeat and store `offsets` (next offset to replicate) atomically, only under `lease`'s epoch.

        `destination_offsets`: where the partition's next copy goes at the destination (a partition without a new
        one keeps its stored value), read from at a start (`replicator.engine.destination_copies`). One statement
        for every changed partition: a topic's partitions go as one array, merged into the stored one element by
        element. `segments`: where the record batches copied since the last commit went (`segment_store.py`), in
        the same transaction, so that stored offsets never run ahead of the segments that translate them."""
        with Session(self.engine) as s, s.begin():
            self._fence_check(s, lease)
            if offsets:
                s.execute(
                    _MERGE_OFFSETS,
                    {
                        "connector": lease.connector,
                        "epoch": lease.epoch,
                        **_topic_arrays(offsets, destination_offsets or {}),
                    },
                )
            write_segments(s, lease.connector, segments)

    def load_offsets(
        self, connector: str, partitions: Iterable[SourcePartition] | None = None
    ) -> dict[SourcePartition, int]:
        return self._stored(connector, Offset.positions, partitions)

    def load_destination_offsets(
        self, connector: str, partitions: Iterable[SourcePartition]
    ) -> dict[SourcePartition, int]:
        """Where each partition's committed copies end at the destination, where recorded."""
        return self._stored(connector, Offset.destination_positions, partitions)

    def _stored(
        self, connector: str, column: Any, partitions: Iterable[SourcePartition] | None
    ) -> dict[SourcePartition, int]:
        wanted = set(partitions) if partitions is not None else None
        query = select(Offset.topic, column).where(Offset.connector == connector, column.is_not(None))
        if wanted is not None:
            if not wanted:
                return {}
            query = query.where(Offset.topic.in_(sorted({t for t, _ in wanted})))
        with self.engine.connect() as conn:
            stored = {
                (topic, p): offset
                for topic, values in conn.execute(query)
                for p, offset in enumerate(values)
                if offset is not None
            }
        return stored if wanted is None else {tp: o for tp, o in stored.items() if tp in wanted}

    def alter_offsets_of_stopped(
        self, connector: str, offsets: Mapping[SourcePartition, int | None] | None, stale_after: timedelta
    ) -> None:
        """Operator tool: set (None: forget) stored offsets, or with `offsets=None` forget them all.

        Only while the connector is PAUSED and no task of it still holds a live lease: a task that is still
        stopping writes its final commit and would undo the change. Checked and applied in one transaction with
        the connector row locked, so no task can start in between.
        """
        with Session(self.engine) as s, s.begin():
            row = s.get(Connector, connector, with_for_update=True)
            if row is None:
                raise UnknownConnectorError(f"connector {connector!r} does not exist")
            if row.state != ConnectorState.PAUSED:
                raise ConnectorNotStoppedError(
                    f"connector {connector!r} is {row.state}: pause it before changing its offsets"
                )
            live = s.scalars(
                select(TaskLease.task_id).where(
                    TaskLease.connector == connector,
                    TaskLease.state == LEASE_HELD,
                    TaskLease.heartbeat_at > func.now() - stale_after,
                )
            ).all()
            if live:
                raise TasksStillStoppingError(
                    f"connector {connector!r} is paused but task(s) {', '.join(map(str, sorted(live)))} are still "
                    "stopping; retry in a few seconds"
                )
            if offsets is None:
                s.execute(delete(Offset).where(Offset.connector == connector))
                return
            by_topic: dict[str, dict[int, int | None]] = {}
            for (topic, partition), offset in offsets.items():
                by_topic.setdefault(topic, {})[partition] = offset
            for topic, changes in sorted(by_topic.items()):
                stored = s.get(Offset, (connector, topic), with_for_update=True)
                positions = list(stored.positions) if stored else []
                destinations = list(stored.destination_positions or []) if stored else []
                for partition, offset in changes.items():
                    positions.extend([None] * (partition + 1 - len(positions)))
                    positions[partition] = offset
                    if partition < len(destinations):
                        destinations[partition] = None  # set by hand: no copy is known to end anywhere
                while positions and positions[-1] is None:
                    positions.pop()
                if stored is not None:
                    s.delete(stored)
                    s.flush()
                if any(p is not None for p in positions):
                    s.add(
                        Offset(
                            connector=connector,
                            topic=topic,
                            positions=positions,
                            epoch=0,
                            destination_positions=destinations if any(d is not None for d in destinations) else None,
                        )
                    )
