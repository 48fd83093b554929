"""The platform's tables. Postgres is the system of record; migrations live in `replicator/state/migrations`.

- `connectors` / `connector_configs`: a connector and every version of its configuration.
- `assignments`: which source partitions each task owns, per assignment generation.
- `task_leases`: which task instance may write, fenced by a growing epoch, with heartbeats.
- `offsets`: the next source offset to replicate, per connector and source topic, one array element per partition
  (exactly-once: and where its copies end at the destination).
- `partition_status`: a partition paused or dropped by the engine, and why.
- `partition_pauses`: a partition paused by an operator, and why, until an operator resumes it.
- `metadata_snapshots`: what the monitor saw on a cluster.
- `metric_samples`: per task, source topic and interval: records, bytes, latency summary and histogram, lag, what
  went as record batches and the batch path's hand-backs.
- `metric_totals`: per connector and source topic, the running totals of those samples (never lowered).
- `partition_lags`: per connector and source topic, each partition's latest lag (an array element each, overwritten).
- `flows`: per connector, its clusters' ids and its periodic duties (topic configs, group offsets, heartbeats).
- `checkpoints`: a source consumer group's committed offset and its exact destination translation.
- `copy_segments`: where stretches of a source partition copied as record batches (no provenance header) are.
- `platform_producer_ids`: the producer ids this platform's flows hold at each cluster (the batch path's cycle guard).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, ForeignKey, Index, Integer, MetaData, Text, func
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _now() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


class Connector(Base):
    __tablename__ = "connectors"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, nullable=False, doc="Current connector_configs.version.")
    state: Mapped[str] = mapped_column(Text, nullable=False, doc="RUNNING or PAUSED (the operator's intent).")
    assignment_generation: Mapped[int] = mapped_column(
        BigInteger,
        nullable=False,
        server_default="0",
        doc="Current generation in `assignments`; 0 = none yet.",
    )
    tasks_max: Mapped[int] = mapped_column(Integer, nullable=False, server_default="1")
    restart_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    pauses_version: Mapped[int] = mapped_column(
        BigInteger,
        nullable=False,
        server_default="0",
        doc="Raised by every operator pause or resume of a partition: a running task, which polls this row, re-reads "
        "`partition_pauses` only when it changes.",
    )
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()


class ConnectorVersion(Base):
    """One version of a connector's properties, as submitted (`Connector.version` names the current one)."""

    __tablename__ = "connector_configs"

    connector: Mapped[str] = mapped_column(Text, ForeignKey("connectors.name", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, doc="Properties as submitted.")
    created_at: Mapped[datetime] = _now()


class Assignment(Base):
    __tablename__ = "assignments"

    connector: Mapped[str] = mapped_column(Text, ForeignKey("connectors.name", ondelete="CASCADE"), primary_key=True)
    generation: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    task_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    partitions: Mapped[list[list[Any]]] = mapped_column(
        JSONB, nullable=False, doc="Sorted [topic, partition] pairs owned by the task in this generation."
    )
    created_at: Mapped[datetime] = _now()


class TaskLease(Base):
    __tablename__ = "task_leases"

    connector: Mapped[str] = mapped_column(Text, ForeignKey("connectors.name", ondelete="CASCADE"), primary_key=True)
    task_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    owner: Mapped[str | None] = mapped_column(Text, doc="Who holds the lease: host, pid and run id.")
    state: Mapped[str] = mapped_column(Text, nullable=False, server_default="UNASSIGNED")
    error: Mapped[str | None] = mapped_column(Text)
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    restart_attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")


class Offset(Base):
    """A source topic's offsets, element p + 1 for partition p (NULL: none stored).

    One row per topic, not per partition: a task holding thousands of partitions commits them all as a few array
    updates, far cheaper for Postgres than a row each. Two tasks sharing a topic merge element by
    element under the row lock, so neither overwrites the other's partitions.

    Deliberately not tied to `connectors`: like Kafka Connect, a re-created connector resumes.
    """

    __tablename__ = "offsets"

    connector: Mapped[str] = mapped_column(Text, primary_key=True)
    topic: Mapped[str] = mapped_column(Text, primary_key=True)
    positions: Mapped[list[int | None]] = mapped_column(
        ARRAY(BigInteger), nullable=False, doc="Next source offset to replicate, per partition."
    )
    destination_positions: Mapped[list[int | None] | None] = mapped_column(
        ARRAY(BigInteger),
        doc="The destination offset of the partition's next copy as of the commit (exactly-once: after the last "
        "committed transaction's copies); a start reads the destination from here.",
    )
    epoch: Mapped[int] = mapped_column(BigInteger, nullable=False, doc="Lease epoch of the last writer.")
    updated_at: Mapped[datetime] = _now()


class PartitionStatus(Base):
    __tablename__ = "partition_status"

    connector: Mapped[str] = mapped_column(Text, ForeignKey("connectors.name", ondelete="CASCADE"), primary_key=True)
    topic: Mapped[str] = mapped_column(Text, primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_id: Mapped[int | None] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(Text, nullable=False, doc="ACTIVE, PAUSED or DROPPED.")
    reason: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = _now()


class PartitionPause(Base):
    """A source partition an operator paused: the task holding it reads none of it until an operator resumes it,
    across task restarts and takeovers. Apart from `partition_status`, which the engine writes and overwrites."""

    __tablename__ = "partition_pauses"

    connector: Mapped[str] = mapped_column(Text, ForeignKey("connectors.name", ondelete="CASCADE"), primary_key=True)
    topic: Mapped[str] = mapped_column(Text, primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    reason: Mapped[str] = mapped_column(Text, nullable=False, doc="Why, as the operator gave it.")
    paused_at: Mapped[datetime] = _now()


class MetadataSnapshot(Base):
    __tablename__ = "metadata_snapshots"
    __table_args__ = (Index("ix_metadata_snapshots_connector_taken_at", "connector", "taken_at"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    connector: Mapped[str | None] = mapped_column(Text)
    cluster: Mapped[str] = mapped_column(Text, nullable=False, doc="'source' or 'destination'.")
    topics: Mapped[dict[str, int]] = mapped_column(JSONB, nullable=False, doc="Topic name -> partition count.")
    error: Mapped[str | None] = mapped_column(Text)
    taken_at: Mapped[datetime] = _now()


class MetricSample(Base):
    __tablename__ = "metric_samples"
    __table_args__ = (
        Index("ix_metric_samples_connector_interval_end", "connector", "interval_end"),
        # The last minute's rates, the lake's export and pruning select by time alone.
        Index("ix_metric_samples_interval_end", "interval_end"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    connector: Mapped[str] = mapped_column(Text, nullable=False)
    task_id: Mapped[int] = mapped_column(Integer, nullable=False)
    topic: Mapped[str] = mapped_column(Text, nullable=False, doc="The source topic (a row sums its partitions).")
    interval_start: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    interval_end: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    records: Mapped[int] = mapped_column(BigInteger, nullable=False)
    bytes: Mapped[int] = mapped_column(BigInteger, nullable=False)
    latency_min_ms: Mapped[int | None] = mapped_column(BigInteger)
    latency_max_ms: Mapped[int | None] = mapped_column(BigInteger)
    latency_sum_ms: Mapped[int] = mapped_column(BigInteger, nullable=False)
    latency_count: Mapped[int] = mapped_column(BigInteger, nullable=False)
    latency_histogram: Mapped[dict[str, int]] = mapped_column(
        JSONB, nullable=False, doc="Upper bound in ms ('+Inf' last) -> count of records at or below it."
    )
    lag: Mapped[int | None] = mapped_column(
        BigInteger, doc="Source records not yet replicated, summed over the task's partitions whose lag is known."
    )
    resent: Mapped[int] = mapped_column(
        BigInteger,
        nullable=False,
        server_default="0",
        doc="Records written again after a restart (at least once: those copied after the last commit before it).",
    )
    batch_records: Mapped[int] = mapped_column(
        BigInteger, nullable=False, server_default="0", doc="Of `records`, those copied as record batches."
    )
    batch_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    handed_back: Mapped[dict[str, int]] = mapped_column(
        JSONB,
        nullable=False,
        server_default="{}",
        doc="Reason -> times the batch path handed a partition of the topic back to the record path.",
    )


class MetricTotal(Base):
    """Cumulative counters per connector and source topic, added to in the transaction that stores the samples:
    what the Prometheus counters report. Pruning `metric_samples` leaves them as they are, so a counter never goes
    down, and a scrape reads one row per series however long the samples are kept."""

    __tablename__ = "metric_totals"

    connector: Mapped[str] = mapped_column(Text, primary_key=True)
    topic: Mapped[str] = mapped_column(Text, primary_key=True)
    records: Mapped[int] = mapped_column(BigInteger, nullable=False)
    bytes: Mapped[int] = mapped_column(BigInteger, nullable=False)
    latency_sum_ms: Mapped[int] = mapped_column(BigInteger, nullable=False)
    latency_count: Mapped[int] = mapped_column(BigInteger, nullable=False)
    latency_histogram: Mapped[dict[str, int]] = mapped_column(
        JSONB, nullable=False, doc="Upper bound in ms ('+Inf' last) -> records at or below it, since the start."
    )
    resent: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    batch_records: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    batch_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    handed_back: Mapped[dict[str, int]] = mapped_column(JSONB, nullable=False, server_default="{}")
    updated_at: Mapped[datetime] = _now()


class TopicLags(Base):
    """A source topic's partition lags, each as of its newest sample, overwritten (a gauge, not a time series): one
    row per source topic, an array element per partition, so that an interval's changed lags cost a row write per
    topic."""

    __tablename__ = "partition_lags"

    connector: Mapped[str] = mapped_column(Text, primary_key=True)
    topic: Mapped[str] = mapped_column(Text, primary_key=True)
    lags: Mapped[list[int | None]] = mapped_column(
        ARRAY(BigInteger),
        nullable=False,
        doc="Element p + 1 is partition p's lag; NULL where none is known (never measured, or the broker gave no "
        "usable end offset).",
    )
    measured_at: Mapped[list[datetime | None]] = mapped_column(
        ARRAY(DateTime(timezone=True)),
        nullable=False,
        doc="Element p + 1: when partition p's lag was measured (NULL: never). Per partition, because two tasks "
        "share a topic and each must lose only to a newer measurement of the same partition.",
    )
    updated_at: Mapped[datetime] = _now()


class Flow(Base):
    """A connector's flow between two clusters, as the monitor last saw it, and when its periodic duties ran."""

    __tablename__ = "flows"

    connector: Mapped[str] = mapped_column(Text, ForeignKey("connectors.name", ondelete="CASCADE"), primary_key=True)
    source_cluster_id: Mapped[str | None] = mapped_column(Text, doc="Kafka cluster id of the source.")
    destination_cluster_id: Mapped[str | None] = mapped_column(Text, doc="Kafka cluster id of the destination.")
    configs_synced_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    groups_synced_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    heartbeat_emitted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    acls_synced_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), doc="When the last topic ACL sync succeeded."
    )
    acls_mirrored: Mapped[int | None] = mapped_column(
        Integer, doc="Destination topic ACLs that sync found or created (MirrorMaker 2's rules)."
    )
    heartbeats: Mapped[list[list[int]]] = mapped_column(
        JSONB,
        nullable=False,
        server_default="[]",
        doc="Recent heartbeats emitted at the source: [partition, offset, timestamp ms], newest last.",
    )
    problems: Mapped[dict[str, str]] = mapped_column(
        JSONB, nullable=False, server_default="{}", doc="What failed in the last topic or group sync -> why."
    )
    updated_at: Mapped[datetime] = _now()


class Checkpoint(Base):
    """Deliberately not tied to `connectors`: checkpoints are what a failover needs, also after a delete."""

    __tablename__ = "checkpoints"

    connector: Mapped[str] = mapped_column(Text, primary_key=True)
    group_id: Mapped[str] = mapped_column(Text, primary_key=True)
    topic: Mapped[str] = mapped_column(Text, primary_key=True, doc="Source topic.")
    partition: Mapped[int] = mapped_column(Integer, primary_key=True, doc="Source partition.")
    source_offset: Mapped[int] = mapped_column(BigInteger, nullable=False, doc="The group's committed offset.")
    destination_topic: Mapped[str] = mapped_column(Text, nullable=False)
    destination_partition: Mapped[int] = mapped_column(Integer, nullable=False)
    destination_offset: Mapped[int] = mapped_column(
        BigInteger, nullable=False, doc="Where the group resumes at the destination: nothing skipped or re-read."
    )
    updated_at: Mapped[datetime] = _now()


class Segment(Base):
    """A stretch of a source partition copied as record batches, which carry no provenance header, and where its
    copies are (`CopySegment`). Contiguous stretches are one row, so rows grow with gaps (compaction, batches the
    record path took, restarts), not with traffic. The key ends with the destination offset: the newest segment of
    a source partition in a destination partition is the last of that key range.

    Deliberately not tied to `connectors`, like `checkpoints`: failover translates through them after a delete."""

    __tablename__ = "copy_segments"
    __table_args__ = (
        # Which source record a flow's copy at a given destination offset stands for (failback translation).
        Index(
            "ix_copy_segments_destination",
            "connector",
            "destination_topic",
            "destination_partition",
            "destination_start",
        ),
    )

    connector: Mapped[str] = mapped_column(Text, primary_key=True)
    topic: Mapped[str] = mapped_column(Text, primary_key=True, doc="Source topic.")
    partition: Mapped[int] = mapped_column(Integer, primary_key=True, doc="Source partition.")
    destination_topic: Mapped[str] = mapped_column(Text, primary_key=True)
    destination_partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    destination_start: Mapped[int] = mapped_column(BigInteger, primary_key=True, doc="Offset of the first copy.")
    source_start: Mapped[int] = mapped_column(BigInteger, nullable=False, doc="Offset of the first source record.")
    count: Mapped[int] = mapped_column(BigInteger, nullable=False, doc="Records, at consecutive offsets on both sides.")


class PlatformProducerId(Base):
    """A producer id a flow of this platform holds at a cluster, recorded before it writes anything there: a batch
    carrying it was written by this platform, and the batch path never copies it back."""

    __tablename__ = "platform_producer_ids"

    cluster_id: Mapped[str] = mapped_column(Text, primary_key=True, doc="Kafka cluster id the producer writes to.")
    producer_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    connector: Mapped[str] = mapped_column(Text, nullable=False)
    task_id: Mapped[int] = mapped_column(Integer, nullable=False)
    epoch: Mapped[int] = mapped_column(BigInteger, nullable=False, doc="The task's lease epoch that recorded it.")
    recorded_at: Mapped[datetime] = _now()
