"""The store's vocabulary: connector and partition states, its errors, and the typed rows it reads and writes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from replicator.assignment import SourcePartition


class ConnectorState(StrEnum):
    """The operator's intent for a connector."""

    RUNNING = "RUNNING"
    PAUSED = "PAUSED"


class PartitionHealth(StrEnum):
    """A source partition as its task reports it: replicating, paused after a failure (retried), or gone."""

    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    DROPPED = "DROPPED"


OPERATOR_PAUSE = "paused by an operator"  # how a partition in `partition_pauses` is shown, and why its task holds it
KEPT_GENERATIONS = 10  # assignment generations kept per connector, the current one included
LEASE_HELD = "RUNNING"  # a lease's state while an instance holds it (see LeaseRow.state)


class FencedError(RuntimeError):
    """Another instance of this task claimed it with a newer epoch; this one must stop without writing."""


class UnknownConnectorError(LookupError):
    pass


class PartitionPauseError(ValueError):
    """An operator's pause names a partition the connector does not replicate, or gives no usable reason."""


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
    pauses_version: int = 0  # raised by every operator pause or resume of one of its partitions


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
class PartitionPauseRow:
    """A source partition an operator paused, why, and since when."""

    reason: str
    paused_at: datetime


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
    acls_synced_at: datetime | None = None
    acls_mirrored: int | None = None
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
class CopySegment:
    """Source offsets `source_start` .. `source_start + count - 1` of `topic`[`partition`], copied as record batches
    (bytes, no provenance header) to `destination_start` onwards of `destination_topic`[`destination_partition`], in
    order and without gaps: the provenance of shallow copies (issue 48). The store keeps contiguous ones as one."""

    topic: str
    partition: int
    source_start: int
    destination_topic: str
    destination_partition: int
    destination_start: int
    count: int


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
    operator_pauses: dict[SourcePartition, PartitionPauseRow] = field(default_factory=dict)
    acl_sync: tuple[int, datetime] | None = None  # destination topic ACLs mirrored, and when (last sync that worked)


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
    resent: int = 0  # records written again after a restart: copied after the last commit before it
    batch_records: int = 0  # of `records`, those copied as record batches (copy.mode=batches)
    batch_bytes: int = 0
    handed_back: dict[str, int] = field(default_factory=dict)  # the batch path's hand-backs, by reason


@dataclass(frozen=True)
class MetricInterval:
    """What a task writes per interval: a sample per topic, and the partitions whose lag changed."""

    samples: Sequence[MetricRow]
    lags: Mapping[SourcePartition, int]  # only known lags: an unknown one leaves the stored value as it is
    measured_at: datetime  # when `lags` were measured: a later measurement already stored wins


@dataclass(frozen=True)
class TopicTotals:
    """Per connector and source topic, since the connector was created."""

    connector: str
    topic: str
    records: int
    bytes: int
    latency_sum_ms: int
    latency_count: int
    histogram: dict[str, int]  # upper bound in ms ('+Inf') -> records at or below it
    resent: int  # written again after restarts
    batch_records: int = 0  # of `records`, those copied as record batches
    batch_bytes: int = 0
    handed_back: dict[str, int] = field(default_factory=dict)  # the batch path's hand-backs, by reason


@dataclass(frozen=True)
class RecentTopic:
    """Per connector and source topic, over a recent window."""

    connector: str
    topic: str
    records: int
    bytes: int
    latency_min_ms: int | None
    latency_max_ms: int | None


@dataclass(frozen=True)
class PartitionLagRow:
    """A source partition's latest known lag."""

    connector: str
    topic: str
    partition: int
    lag: int
