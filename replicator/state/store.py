"""Everything the engine reads from and writes to Postgres, in one place.

Fencing rule: a task writes offsets, heartbeats and partition claims only in a transaction that first updates its
own lease row *with its epoch in the WHERE clause*. A newer claim raises the epoch, so the older instance's next
write matches no row and it learns it was fenced; the row lock makes a claim wait for an in-flight commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    Engine,
    Integer,
    Text,
    and_,
    bindparam,
    delete,
    func,
    literal,
    literal_column,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, insert
from sqlalchemy.orm import Session

from replicator.assignment import SourcePartition, membership
from replicator.state.schema import (
    Assignment,
    Checkpoint,
    Connector,
    ConnectorConfig,
    Flow,
    MetadataSnapshot,
    MetricSample,
    MetricTotal,
    Offset,
    PartitionLag,
    PartitionStatus,
    TaskLease,
)


class ConnectorState(StrEnum):
    """The operator's intent for a connector."""

    RUNNING = "RUNNING"
    PAUSED = "PAUSED"


class PartitionHealth(StrEnum):
    """A source partition as its task reports it: replicating, paused after a failure (retried), or gone."""

    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    DROPPED = "DROPPED"


KEPT_GENERATIONS = 10  # assignment generations kept per connector, the current one included
LEASE_HELD = "RUNNING"  # a lease's state while an instance holds it (see LeaseRow.state)


class FencedError(RuntimeError):
    """Another instance of this task claimed it with a newer epoch; this one must stop without writing."""


class UnknownConnectorError(LookupError):
    pass


class ConnectorNotStoppedError(RuntimeError):
    """Offsets may only change while the connector is paused and none of its tasks still runs."""


class TasksStillStoppingError(ConnectorNotStoppedError):
    """The connector is paused, but some of its tasks have not finished their final commit yet."""


@dataclass(frozen=True)
class ConnectorRecord:
    name: str
    version: int
    state: ConnectorState
    assignment_generation: int
    tasks_max: int
    properties: dict[str, Any]
    restart_requested_at: datetime | None
    updated_at: datetime


@dataclass(frozen=True)
class ConnectorHead:
    """The few columns a running task polls every second to notice changes."""

    version: int
    state: ConnectorState
    assignment_generation: int
    restart_requested_at: datetime | None


@dataclass(frozen=True)
class Lease:
    connector: str
    task_id: int
    epoch: int


@dataclass(frozen=True)
class LeaseRow:
    """A task's lease: its current epoch and owner, how its last instance ended, heartbeats and restarts."""

    connector: str
    task_id: int
    epoch: int
    owner: str | None
    state: str  # RUNNING while held; afterwards how the instance ended (STOPPED, FAILED, PAUSED, ...)
    error: str | None
    claimed_at: datetime | None
    heartbeat_at: datetime | None
    restart_attempts: int


@dataclass(frozen=True)
class PartitionStatusRow:
    """Who owns a source partition (None: released) and its health, with the reason an operator sees."""

    task_id: int | None
    state: PartitionHealth
    reason: str | None
    updated_at: datetime


@dataclass(frozen=True)
class SnapshotRow:
    """What a monitor last saw on one cluster: topic -> partition count, or the error that stopped it."""

    cluster: str
    topics: dict[str, int]
    error: str | None
    taken_at: datetime


@dataclass(frozen=True)
class FlowRow:
    """A connector's flow as the monitor keeps it: both clusters' ids, when each periodic duty last ran, the
    heartbeats it emitted recently ([offset, timestamp ms]) and what its duties could not do."""

    source_cluster_id: str | None = None
    destination_cluster_id: str | None = None
    configs_synced_at: datetime | None = None
    groups_synced_at: datetime | None = None
    heartbeat_emitted_at: datetime | None = None
    heartbeats: list[list[int]] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointRow:
    """A consumer group's committed source offset and where it resumes at the destination."""

    group_id: str
    topic: str
    partition: int
    source_offset: int
    destination_topic: str
    destination_partition: int
    destination_offset: int
    updated_at: datetime


@dataclass(frozen=True)
class TaskStatus:
    task_id: int
    partitions: int
    state: str  # the lease's state; UNASSIGNED before the task's first claim
    heartbeat_at: datetime | None
    restart_attempts: int
    owner: str | None = None  # the lease holder: host:pid[:run id]
    error: str | None = None  # why its last instance failed


@dataclass(frozen=True)
class ConnectorStatus:
    """One connector as an operator sees it: `Store.connector_statuses` reads all of them in one query."""

    name: str
    state: ConnectorState
    version: int
    assignment_generation: int
    properties: dict[str, Any]
    tasks: list[TaskStatus]
    metadata_errors: dict[str, str]  # cluster -> error of its latest snapshot, if that one failed
    unhealthy_partitions: dict[SourcePartition, PartitionStatusRow]  # not ACTIVE
    cluster_ids: tuple[str | None, str | None] = (None, None)  # source, destination (Kafka cluster ids)
    flow_problems: dict[str, str] = field(default_factory=dict)  # what the monitor's periodic duties could not do
    heartbeats: list[list[int]] = field(default_factory=list)  # recent heartbeats emitted: [offset, timestamp ms]
    heartbeats_committed: int | None = None  # the connector's committed offset in its source's heartbeats topic


@dataclass(frozen=True)
class MetricRow:
    """One task's sample of one source topic over one interval."""

    task_id: int
    topic: str
    interval_start: datetime
    interval_end: datetime
    records: int
    bytes: int
    latency_min_ms: int | None
    latency_max_ms: int | None
    latency_sum_ms: int
    latency_count: int
    latency_histogram: dict[str, int]
    lag: int | None  # the sum of the known lags of the task's partitions of the topic


@dataclass(frozen=True)
class MetricInterval:
    """What a task writes per interval: a sample per topic, and the partitions whose lag changed."""

    samples: Sequence[MetricRow]
    lags: Mapping[SourcePartition, int]  # only known lags: an unknown one leaves the stored value as it is
    measured_at: datetime  # when `lags` were measured: a later measurement already stored wins


# Every changed partition of a commit in one statement: per topic, an array with the new offsets at their partitions
# and NULL elsewhere, merged into the stored array element by element (a NULL keeps the stored value; the longer
# array sets the length). Rows come in topic order, so two tasks sharing topics never lock them in opposite orders.
_MERGE_OFFSETS = text("""
INSERT INTO offsets AS o (connector, topic, positions, destination_positions, epoch, updated_at)
SELECT :connector, u.topic, CAST(u.positions AS bigint[]), CAST(u.destinations AS bigint[]), :epoch, now()
FROM unnest(CAST(:topics AS text[]), CAST(:positions AS text[]), CAST(:destinations AS text[]))
  AS u(topic, positions, destinations)
ON CONFLICT (connector, topic) DO UPDATE SET
  positions = (SELECT array_agg(coalesce(n, s) ORDER BY i)
               FROM unnest(o.positions, excluded.positions) WITH ORDINALITY AS m(s, n, i)),
  destination_positions = CASE WHEN excluded.destination_positions IS NULL THEN o.destination_positions ELSE
    (SELECT array_agg(coalesce(n, s) ORDER BY i)
     FROM unnest(o.destination_positions, excluded.destination_positions) WITH ORDINALITY AS m(s, n, i)) END,
  epoch = excluded.epoch, updated_at = now()
""")


def _pairs(partitions: Iterable[SourcePartition]) -> Any:
    """Partitions as (topic, partition) rows from two array parameters: an IN list of pairs grows the statement
    with every partition, and 10,000 of them exceed Postgres's stack depth."""
    pairs = sorted(set(partitions))
    topics = bindparam(None, [t for t, _ in pairs], type_=ARRAY(Text))
    numbers = bindparam(None, [p for _, p in pairs], type_=ARRAY(Integer))
    return func.unnest(topics, numbers).table_valued("topic", "partition").render_derived()


def _among(partitions: Iterable[SourcePartition]) -> Any:
    """`partition_status` rows of `partitions` (a WHERE condition)."""
    pairs = _pairs(partitions)
    return tuple_(PartitionStatus.topic, PartitionStatus.partition).in_(select(pairs.c.topic, pairs.c.partition))


def _topic_arrays(
    offsets: Mapping[SourcePartition, int], destinations: Mapping[SourcePartition, int]
) -> dict[str, Any]:
    """`_MERGE_OFFSETS`'s parameters."""
    by_topic = _by_topic(offsets)
    ends = []
    for topic, changed in by_topic.items():
        own = {p: destinations[(topic, p)] for p in changed if (topic, p) in destinations}
        ends.append(_array_literal(own) if own else None)
    return {"topics": list(by_topic), "positions": [_array_literal(c) for c in by_topic.values()], "destinations": ends}


def _by_topic(values: Mapping[SourcePartition, int]) -> dict[str, dict[int, int]]:
    """Partition -> value, per topic, in topic order: the order rows are written and locked in, so two tasks sharing
    topics never wait on each other in opposite orders (a deadlock)."""
    by_topic: dict[str, dict[int, int]] = {}
    for (topic, partition), value in values.items():
        by_topic.setdefault(topic, {})[partition] = value
    return {topic: by_topic[topic] for topic in sorted(by_topic)}


def _array_literal(values: Mapping[int, int]) -> str:
    """`{NULL,7,NULL,9}` for {1: 7, 3: 9}: array parameters go as literals, which Postgres parses far faster than a
    bound list."""
    row = ["NULL"] * (max(values) + 1)
    for index, value in values.items():
        row[index] = str(value)
    return "{" + ",".join(row) + "}"


# Every changed lag of an interval in one statement, a row per topic as `_MERGE_OFFSETS` writes offsets: a
# partition's element is overwritten only by a measurement at least as recent as the stored one, so a report of an
# older interval (an old owner's, late) loses, and two tasks sharing a topic keep each other's partitions. Freshness
# is per partition because tasks' intervals interleave: a per-topic guard would drop a task's lags whenever another
# task sharing the topic had just written a later interval.
_MERGE_LAGS = text("""
INSERT INTO partition_lags AS l (connector, topic, lags, measured_at, updated_at)
SELECT :connector, u.topic, u.lags,
       (SELECT array_agg(CASE WHEN x IS NOT NULL THEN CAST(:measured_at AS timestamptz) END ORDER BY i)
        FROM unnest(u.lags) WITH ORDINALITY AS v(x, i)),
       now()
FROM (SELECT t.topic, CAST(t.lags AS bigint[]) AS lags
      FROM unnest(CAST(:topics AS text[]), CAST(:lags AS text[])) AS t(topic, lags)) AS u
ON CONFLICT (connector, topic) DO UPDATE SET (lags, measured_at, updated_at) = (
  SELECT array_agg(CASE WHEN newer THEN n ELSE s END ORDER BY i),
         array_agg(CASE WHEN newer THEN CAST(:measured_at AS timestamptz) ELSE t END ORDER BY i), now()
  FROM (SELECT s, n, t, i, n IS NOT NULL AND (t IS NULL OR t <= CAST(:measured_at AS timestamptz)) AS newer
        FROM unnest(l.lags, excluded.lags, l.measured_at) WITH ORDINALITY AS m(s, n, t, i)) AS m)
""")


# A running histogram plus a new one, bound by bound (a bound only one side has counts from that side).
HISTOGRAM_SUM = literal_column(
    "(SELECT jsonb_object_agg(k, coalesce((metric_totals.latency_histogram->>k)::bigint, 0)"
    " + coalesce((excluded.latency_histogram->>k)::bigint, 0))"
    " FROM jsonb_object_keys(metric_totals.latency_histogram || excluded.latency_histogram) AS k)"
)


def _add_to_totals(connector: str, samples: Sequence[MetricRow]) -> Any:
    """An upsert adding the samples to their topics' running totals."""
    totals: dict[str, dict[str, Any]] = {}
    for r in samples:
        total = totals.get(r.topic)
        if total is None:
            total = totals[r.topic] = {"connector": connector, "topic": r.topic, "records": 0, "bytes": 0,
                                       "latency_sum_ms": 0, "latency_count": 0, "latency_histogram": {}}  # fmt: skip
        total["records"] += r.records
        total["bytes"] += r.bytes
        total["latency_sum_ms"] += r.latency_sum_ms
        total["latency_count"] += r.latency_count
        histogram = total["latency_histogram"]
        for bound, count in r.latency_histogram.items():
            histogram[bound] = histogram.get(bound, 0) + count
    # Rows in a fixed order: two tasks of a connector adding to the same totals then never wait on each other in
    # opposite orders (a deadlock).
    add = insert(MetricTotal).values([totals[t] for t in sorted(totals)])
    return add.on_conflict_do_update(
        index_elements=[MetricTotal.connector, MetricTotal.topic],
        set_={"records": MetricTotal.records + add.excluded.records, "bytes": MetricTotal.bytes + add.excluded.bytes,
              "latency_sum_ms": MetricTotal.latency_sum_ms + add.excluded.latency_sum_ms,
              "latency_count": MetricTotal.latency_count + add.excluded.latency_count,
              "latency_histogram": HISTOGRAM_SUM, "updated_at": func.now()},
    )  # fmt: skip


class Store:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- connectors -------------------------------------------------------------------------------------

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
            s.add(ConnectorConfig(connector=name, version=row.version, config=dict(properties)))
            return row.version

    def get_connector(self, name: str) -> ConnectorRecord:
        with Session(self.engine) as s:
            row = s.execute(
                select(Connector, ConnectorConfig.config)
                .join(ConnectorConfig, and_(ConnectorConfig.connector == Connector.name,
                                            ConnectorConfig.version == Connector.version))
                .where(Connector.name == name)
            ).one_or_none()  # fmt: skip
            if row is None:
                raise UnknownConnectorError(f"connector {name!r} does not exist")
            return _record(row[0], row[1])

    def list_connectors(self) -> list[ConnectorRecord]:
        with Session(self.engine) as s:
            rows = s.execute(
                select(Connector, ConnectorConfig.config)
                .join(ConnectorConfig, and_(ConnectorConfig.connector == Connector.name,
                                            ConnectorConfig.version == Connector.version))
                .order_by(Connector.name)
            ).all()  # fmt: skip
            return [_record(c, cfg) for c, cfg in rows]

    def connector_head(self, name: str) -> ConnectorHead | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(Connector.version, Connector.state, Connector.assignment_generation,
                       Connector.restart_requested_at).where(Connector.name == name)
            ).one_or_none()  # fmt: skip
        return ConnectorHead(row[0], ConnectorState(row[1]), *row[2:]) if row else None

    def set_connector_state(self, name: str, state: ConnectorState) -> None:
        with Session(self.engine) as s, s.begin():
            result = s.execute(
                update(Connector).where(Connector.name == name).values(state=state, updated_at=func.now())
            )
            if result.rowcount == 0:
                raise UnknownConnectorError(f"connector {name!r} does not exist")

    def request_restart(self, name: str) -> None:
        with Session(self.engine) as s, s.begin():
            result = s.execute(update(Connector).where(Connector.name == name).values(restart_requested_at=func.now()))
            if result.rowcount == 0:
                raise UnknownConnectorError(f"connector {name!r} does not exist")

    def delete_connector(self, name: str) -> bool:
        """Remove the connector, its versions, assignments, leases, partition status, metric totals and lags.
        Offsets and metric samples are kept (a connector of the same name resumes; reports keep their history)."""
        with Session(self.engine) as s, s.begin():
            s.execute(delete(MetricTotal).where(MetricTotal.connector == name))
            s.execute(delete(PartitionLag).where(PartitionLag.connector == name))
            return s.execute(delete(Connector).where(Connector.name == name)).rowcount > 0

    # -- assignments ------------------------------------------------------------------------------------

    def write_assignment(self, connector: str, tasks: Mapping[int, Sequence[SourcePartition]]) -> int | None:
        """Record `tasks` as a new generation if membership differs from the current one; returns it, or None."""
        wanted = membership(tasks)
        with Session(self.engine) as s, s.begin():
            row = s.get(Connector, connector, with_for_update=True)
            if row is None:
                raise UnknownConnectorError(f"connector {connector!r} does not exist")
            if self._assignment(s, connector, row.assignment_generation) == wanted and row.assignment_generation:
                return None
            row.assignment_generation += 1
            for task_id, parts in wanted.items():
                s.add(Assignment(connector=connector, generation=row.assignment_generation, task_id=task_id,
                                 partitions=[list(tp) for tp in parts]))  # fmt: skip
            # Older generations are history nobody reads: a task reads the generation it just saw in the head row,
            # and keeping a few lets one that saw it moments ago still read it.
            s.execute(delete(Assignment).where(
                Assignment.connector == connector,
                Assignment.generation <= row.assignment_generation - KEPT_GENERATIONS,
            ))  # fmt: skip
            return row.assignment_generation

    def read_assignment(self, connector: str, generation: int | None = None) -> dict[int, list[SourcePartition]]:
        if generation is None:
            return self.current_assignment(connector)[1]
        with Session(self.engine) as s:
            return self._assignment(s, connector, generation)

    def current_assignment(self, connector: str) -> tuple[int, dict[int, list[SourcePartition]]]:
        """The connector's current generation and its assignment."""
        with Session(self.engine) as s:
            generation = s.scalar(select(Connector.assignment_generation).where(Connector.name == connector))
            if generation is None:
                raise UnknownConnectorError(f"connector {connector!r} does not exist")
            return generation, self._assignment(s, connector, generation)

    @staticmethod
    def _assignment(s: Session, connector: str, generation: int) -> dict[int, list[SourcePartition]]:
        rows = s.execute(
            select(Assignment.task_id, Assignment.partitions).where(
                Assignment.connector == connector, Assignment.generation == generation
            )
        ).all()
        return {task_id: [(t, int(p)) for t, p in parts] for task_id, parts in rows}

    # -- leases -----------------------------------------------------------------------------------------

    def claim_task(self, connector: str, task_id: int, owner: str) -> Lease:
        """Take the task over with a new epoch, fencing any earlier instance."""
        with Session(self.engine) as s, s.begin():
            if s.get(Connector, connector) is None:
                raise UnknownConnectorError(f"connector {connector!r} does not exist")
            stmt = insert(TaskLease).values(
                connector=connector, task_id=task_id, epoch=1, owner=owner, state=LEASE_HELD,
                claimed_at=func.now(), heartbeat_at=func.now(),
            )  # fmt: skip
            stmt = stmt.on_conflict_do_update(
                index_elements=[TaskLease.connector, TaskLease.task_id],
                set_={"epoch": TaskLease.epoch + 1, "owner": owner, "state": LEASE_HELD, "error": None,
                      "claimed_at": func.now(), "heartbeat_at": func.now()},
            ).returning(TaskLease.epoch)  # fmt: skip
            return Lease(connector, task_id, s.execute(stmt).scalar_one())

    def _fence_check(self, s: Session, lease: Lease, **values: Any) -> None:
        result = s.execute(
            update(TaskLease)
            .where(TaskLease.connector == lease.connector, TaskLease.task_id == lease.task_id,
                   TaskLease.epoch == lease.epoch)
            .values(heartbeat_at=func.now(), **values)
        )  # fmt: skip
        if result.rowcount == 0:
            raise FencedError(
                f"task {lease.connector}-{lease.task_id} epoch {lease.epoch} was fenced by a newer instance "
                "(or its connector was deleted)"
            )

    def commit(
        self,
        lease: Lease,
        offsets: Mapping[SourcePartition, int],
        destination_offsets: Mapping[SourcePartition, int] | None = None,
    ) -> None:
        """Heartbeat and store `offsets` (next offset to replicate) atomically, only under `lease`'s epoch.

        Exactly-once also stores `destination_offsets`: where the partition's copies end at the destination (a
        partition without a new one keeps its stored value). One statement for every changed partition: a topic's
        partitions go as one array, merged into the stored one element by element."""
        with Session(self.engine) as s, s.begin():
            self._fence_check(s, lease)
            if offsets:
                s.execute(_MERGE_OFFSETS, {
                    "connector": lease.connector, "epoch": lease.epoch,
                    **_topic_arrays(offsets, destination_offsets or {}),
                })  # fmt: skip

    def finish_task(self, lease: Lease, state: str, error: str | None = None) -> None:
        """Record how the task instance ended and release its partitions, if it still holds the lease."""
        try:
            with Session(self.engine) as s, s.begin():
                self._fence_check(s, lease, state=state, error=error)
                s.execute(
                    update(PartitionStatus)
                    .where(PartitionStatus.connector == lease.connector, PartitionStatus.task_id == lease.task_id)
                    .values(task_id=None, updated_at=func.now())
                )
        except FencedError:
            pass  # the newer instance owns the row now

    def record_restart(self, connector: str, task_id: int) -> int:
        """Count a restart of the task (Mirus's restart-attempt metrics); returns the task's total."""
        with Session(self.engine) as s, s.begin():
            stmt = insert(TaskLease).values(connector=connector, task_id=task_id, restart_attempts=1)
            stmt = stmt.on_conflict_do_update(
                index_elements=[TaskLease.connector, TaskLease.task_id],
                set_={"restart_attempts": TaskLease.restart_attempts + 1},
            ).returning(TaskLease.restart_attempts)
            return s.execute(stmt).scalar_one()

    def leases(self, connector: str) -> dict[int, LeaseRow]:
        """Every task lease of `connector` (tasks assigned now and formerly), by task id."""
        with Session(self.engine) as s:
            rows = s.scalars(select(TaskLease).where(TaskLease.connector == connector))
            return {r.task_id: _row(LeaseRow, r) for r in rows}

    def lease_of(self, connector: str, task_id: int) -> LeaseRow | None:
        with Session(self.engine) as s:
            row = s.get(TaskLease, (connector, task_id))
            return _row(LeaseRow, row) if row else None

    # -- offsets ----------------------------------------------------------------------------------------

    def load_offsets(
        self, connector: str, partitions: Iterable[SourcePartition] | None = None
    ) -> dict[SourcePartition, int]:
        return self._stored(connector, Offset.positions, partitions)

    def load_destination_offsets(
        self, connector: str, partitions: Iterable[SourcePartition]
    ) -> dict[SourcePartition, int]:
        """Exactly-once: where each partition's committed copies end at the destination, where recorded."""
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
                    TaskLease.connector == connector, TaskLease.state == LEASE_HELD,
                    TaskLease.heartbeat_at > func.now() - stale_after,
                )
            ).all()  # fmt: skip
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
                row = s.get(Offset, (connector, topic), with_for_update=True)
                positions = list(row.positions) if row else []
                destinations = list(row.destination_positions or []) if row else []
                for partition, offset in changes.items():
                    positions.extend([None] * (partition + 1 - len(positions)))
                    positions[partition] = offset
                    if partition < len(destinations):
                        destinations[partition] = None  # set by hand: no copy is known to end anywhere
                while positions and positions[-1] is None:
                    positions.pop()
                if row is not None:
                    s.delete(row)
                    s.flush()
                if any(p is not None for p in positions):
                    s.add(Offset(connector=connector, topic=topic, positions=positions, epoch=0,
                                 destination_positions=destinations if any(d is not None for d in destinations)
                                 else None))  # fmt: skip

    # -- partition ownership and status -----------------------------------------------------------------

    def claim_partitions(
        self, lease: Lease, partitions: Sequence[SourcePartition], stale_after: timedelta
    ) -> list[SourcePartition]:
        """Take ownership of the partitions no other live task holds; returns those now owned by this task.

        A partition held by another task is taken only once that task released it (after flushing and
        committing) or its lease stopped heartbeating for `stale_after`.
        """
        return sorted(self.claim_partitions_from(lease, partitions, stale_after))

    def claim_partitions_from(
        self, lease: Lease, partitions: Sequence[SourcePartition], stale_after: timedelta
    ) -> dict[SourcePartition, int | None]:
        """`claim_partitions`, telling for each partition taken the other task that held it without releasing it
        (a silent one: exactly-once fences it before writing), or None."""
        if not partitions:
            return {}
        with Session(self.engine) as s, s.begin():
            self._fence_check(s, lease)
            held = dict(
                ((t, p), task) for t, p, task in s.execute(
                    select(PartitionStatus.topic, PartitionStatus.partition, PartitionStatus.task_id)
                    .where(PartitionStatus.connector == lease.connector, PartitionStatus.task_id.is_not(None),
                           PartitionStatus.task_id != lease.task_id, _among(partitions))
                    .with_for_update()
                )
            )  # fmt: skip
            # The conflicting row's owner is referenced by name: a correlated subquery cannot be expressed here.
            owner_gone = text(
                "NOT EXISTS (SELECT 1 FROM task_leases l WHERE l.connector = partition_status.connector"
                " AND l.task_id = partition_status.task_id AND l.state = :held"
                " AND l.heartbeat_at > now() - :stale)"
            ).bindparams(stale=stale_after, held=LEASE_HELD)
            pairs = _pairs(partitions)
            stmt = insert(PartitionStatus).from_select(
                ["connector", "topic", "partition", "task_id", "state"],
                select(literal(lease.connector), pairs.c.topic, pairs.c.partition, literal(lease.task_id),
                       literal(PartitionHealth.ACTIVE.value)),
            )  # fmt: skip
            stmt = stmt.on_conflict_do_update(
                index_elements=[PartitionStatus.connector, PartitionStatus.topic, PartitionStatus.partition],
                set_={
                    "task_id": lease.task_id,
                    "state": PartitionHealth.ACTIVE,
                    "reason": None,
                    "updated_at": func.now(),
                },
                where=or_(PartitionStatus.task_id.is_(None), PartitionStatus.task_id == lease.task_id, owner_gone),
            ).returning(PartitionStatus.topic, PartitionStatus.partition)
            return {(t, p): held.get((t, p)) for t, p in s.execute(stmt)}

    def release_partitions(self, lease: Lease, partitions: Iterable[SourcePartition]) -> None:
        wanted = list(partitions)
        if not wanted:
            return
        with Session(self.engine) as s, s.begin():
            self._fence_check(s, lease)
            s.execute(
                update(PartitionStatus)
                .where(PartitionStatus.connector == lease.connector, PartitionStatus.task_id == lease.task_id,
                       _among(wanted))
                .values(task_id=None, updated_at=func.now())
            )  # fmt: skip

    def set_partition_state(
        self, lease: Lease, partition: SourcePartition, state: PartitionHealth, reason: str | None
    ) -> None:
        """A partition's health, with the reason an operator sees."""
        with Session(self.engine) as s, s.begin():
            self._fence_check(s, lease)
            stmt = insert(PartitionStatus).values(
                connector=lease.connector, topic=partition[0], partition=partition[1], task_id=lease.task_id,
                state=state, reason=reason,
            )  # fmt: skip
            s.execute(
                stmt.on_conflict_do_update(
                    index_elements=[PartitionStatus.connector, PartitionStatus.topic, PartitionStatus.partition],
                    set_={"state": state, "reason": reason, "updated_at": func.now()},
                )
            )

    def hold_partitions(
        self, connector: str, held: Mapping[SourcePartition, str], assigned: Iterable[SourcePartition]
    ) -> None:
        """Record the partitions the monitor holds back from assignment (PAUSED, with why), unless a task owns
        the row; unowned PAUSED rows of partitions now neither held nor assigned are removed (stale reasons)."""
        keep = set(held) | set(assigned)
        with Session(self.engine) as s, s.begin():
            if held:
                stmt = insert(PartitionStatus).values(
                    [{"connector": connector, "topic": t, "partition": p, "task_id": None,
                      "state": PartitionHealth.PAUSED, "reason": reason} for (t, p), reason in sorted(held.items())]
                )  # fmt: skip
                s.execute(
                    stmt.on_conflict_do_update(
                        index_elements=[PartitionStatus.connector, PartitionStatus.topic, PartitionStatus.partition],
                        set_={"state": PartitionHealth.PAUSED, "reason": stmt.excluded.reason,
                              "updated_at": func.now()},
                        where=and_(PartitionStatus.task_id.is_(None), or_(
                            PartitionStatus.state != PartitionHealth.PAUSED,
                            PartitionStatus.reason.is_distinct_from(stmt.excluded.reason))),
                    )
                )  # fmt: skip
            unowned = s.execute(
                select(PartitionStatus.topic, PartitionStatus.partition).where(
                    PartitionStatus.connector == connector, PartitionStatus.task_id.is_(None),
                    PartitionStatus.state == PartitionHealth.PAUSED,
                )
            ).all()  # fmt: skip
            stale = [(t, p) for t, p in unowned if (t, p) not in keep]
            if stale:
                s.execute(
                    delete(PartitionStatus).where(
                        PartitionStatus.connector == connector, PartitionStatus.task_id.is_(None),
                        _among(stale),
                    )
                )  # fmt: skip

    def unowned_paused(self) -> dict[str, set[SourcePartition]]:
        """Every connector's PAUSED partitions no task owns (those the monitor holds back, and stale ones it
        removes), in one query: the watcher learns which connectors' polls have any to write."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(PartitionStatus.connector, PartitionStatus.topic, PartitionStatus.partition).where(
                    PartitionStatus.task_id.is_(None), PartitionStatus.state == PartitionHealth.PAUSED
                )
            )
            found: dict[str, set[SourcePartition]] = {}
            for connector, topic, partition in rows:
                found.setdefault(connector, set()).add((topic, partition))
            return found

    def partition_statuses(self, connector: str) -> dict[SourcePartition, PartitionStatusRow]:
        with Session(self.engine) as s:
            rows = s.scalars(select(PartitionStatus).where(PartitionStatus.connector == connector))
            return {
                (r.topic, r.partition): PartitionStatusRow(r.task_id, PartitionHealth(r.state), r.reason, r.updated_at)
                for r in rows
            }

    def connector_statuses(self, name: str | None = None) -> list[ConnectorStatus]:
        """Every connector (or only `name`) with its tasks, leases, metadata errors and unhealthy partitions: one
        query."""
        with self.engine.connect() as conn:
            rows = conn.execute(_STATUS_QUERY, {"name": name}).all()
        return [
            ConnectorStatus(
                name=r.name, state=ConnectorState(r.state), version=r.version,
                assignment_generation=r.assignment_generation, properties=r.config,
                tasks=[TaskStatus(t["task_id"], t["partitions"], t["state"], _timestamp(t["heartbeat_at"]),
                                  t["restart_attempts"], t["owner"], t["error"]) for t in r.tasks],
                metadata_errors=dict(r.metadata_errors),
                unhealthy_partitions={
                    (p["topic"], p["partition"]): PartitionStatusRow(
                        p["task_id"], PartitionHealth(p["state"]), p["reason"], _timestamp(p["updated_at"])
                    )
                    for p in r.unhealthy
                },
                cluster_ids=(r.source_cluster_id, r.destination_cluster_id), flow_problems=dict(r.flow_problems),
                heartbeats=list(r.heartbeats), heartbeats_committed=r.heartbeats_committed,
            )
            for r in rows
        ]  # fmt: skip

    # -- observations -----------------------------------------------------------------------------------

    def record_metrics(self, connector: str, interval: MetricInterval) -> None:
        """Store the samples, add them to the connector's running totals and overwrite the changed partitions' lags,
        in one transaction (so a total never counts a sample twice or misses one): three statements, whatever the
        number of partitions, each writing a row per topic."""
        if not interval.samples and not interval.lags:
            return
        with self.engine.begin() as conn:
            if interval.samples:
                # One statement compiled once and cached, its rows sent in batches (executemany): a multi-row
                # VALUES statement built per call costs Python ~0.5 ms a row to compile.
                conn.execute(insert(MetricSample), [{"connector": connector, **r.__dict__} for r in interval.samples])
                conn.execute(_add_to_totals(connector, interval.samples))
            if interval.lags:
                by_topic = _by_topic(interval.lags)
                conn.execute(_MERGE_LAGS, {
                    "connector": connector, "measured_at": interval.measured_at, "topics": list(by_topic),
                    "lags": [_array_literal(lags) for lags in by_topic.values()],
                })  # fmt: skip

    def partition_lags(self, connector: str) -> dict[SourcePartition, int | None]:
        """Each measured source partition's latest lag (None where the broker gave no usable end)."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(PartitionLag.topic, PartitionLag.lags, PartitionLag.measured_at).where(
                    PartitionLag.connector == connector
                )
            )
            return {
                (topic, partition): lag
                for topic, lags, measured in rows
                for partition, (lag, at) in enumerate(zip(lags, measured, strict=True))
                if at is not None
            }

    def metric_samples(self, connector: str) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(MetricSample).where(MetricSample.connector == connector).order_by(MetricSample.id)
            )
            return [dict(r._mapping) for r in rows]

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
            return _row(SnapshotRow, row) if row else None

    # -- flows and checkpoints --------------------------------------------------------------------------

    def flow(self, connector: str) -> FlowRow:
        """The connector's flow (an empty one before the monitor's first poll)."""
        with Session(self.engine) as s:
            row = s.get(Flow, connector)
            return _row(FlowRow, row) if row else FlowRow()

    def update_flow(self, connector: str, **values: Any) -> None:
        """Create or update the connector's `flows` row with `values` (column -> value)."""
        with Session(self.engine) as s, s.begin():
            stmt = insert(Flow).values(connector=connector, **values)
            s.execute(
                stmt.on_conflict_do_update(index_elements=[Flow.connector], set_={**values, "updated_at": func.now()})
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
            return [_row(CheckpointRow, r) for r in rows]


def _record(row: Connector, config: dict[str, Any]) -> ConnectorRecord:
    return ConnectorRecord(
        name=row.name, version=row.version, state=ConnectorState(row.state),
        assignment_generation=row.assignment_generation, tasks_max=row.tasks_max, properties=config,
        restart_requested_at=row.restart_requested_at,
        updated_at=row.updated_at,
    )  # fmt: skip


def _row(kind: type[Any], orm: object) -> Any:
    """A typed row (dataclass `kind`) from an ORM object: the fields of `kind`, by name."""
    return kind(**{name: getattr(orm, name) for name in kind.__dataclass_fields__})


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
  f.source_cluster_id, f.destination_cluster_id, COALESCE(f.problems, '{}'::jsonb) AS flow_problems,
  COALESCE(f.heartbeats, '[]'::jsonb) AS heartbeats,
  (SELECT o.positions[1] FROM offsets o WHERE o.connector = c.name AND o.topic = 'heartbeats')
    AS heartbeats_committed
FROM connectors c JOIN connector_configs cfg ON cfg.connector = c.name AND cfg.version = c.version
  LEFT JOIN flows f ON f.connector = c.name
WHERE CAST(:name AS text) IS NULL OR c.name = :name
ORDER BY c.name
""")
