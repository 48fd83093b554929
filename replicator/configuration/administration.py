"""Connector administration: the one code path behind every way in (launchpad jobs, HTTP API, CLI).

Each operation validates, then changes the store; nothing else. A change becomes visible to Dagster through the
store alone: the run_starter sensor notices new versions, states and deletions and reports them on the `connectors`
asset, and running tasks pick changes up within a second. So a connector changed over the API or the CLI shows
in Dagster exactly like one changed from the launchpad.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from confluent_kafka import Consumer, KafkaException, TopicPartition

from replicator.assignment import SourcePartition
from replicator.clusters import METADATA_TIMEOUT_S, ClusterAdmin, MetadataUnavailableError, read_cluster
from replicator.configuration.connector import ConnectorConfig, ConnectorConfigError, load, validate_submission
from replicator.state.records import (
    LEASE_HELD,
    OPERATOR_PAUSE,
    ConnectorState,
    ConnectorStatus,
    PartitionHealth,
    PartitionPauseError,
    UnknownConnectorError,
)
from replicator.state.store import Store


@dataclass(frozen=True)
class StoredConnector:
    name: str
    version: int
    created: bool  # the connector did not exist before this call
    config: ConnectorConfig


def put_connector(
    store: Store, properties: Mapping[str, object], initial_state: ConnectorState = ConnectorState.RUNNING
) -> StoredConnector:
    """Validate (`validate_submission`: every problem at once, literal secrets refused) and store a configuration:
    a new connector (in `initial_state`) or a new version of one. `ConnectorConfigError` changes nothing."""
    config = validate_submission(properties)
    version = store.put_connector(config.name, config.raw, config.tasks_max, initial_state)
    # Versions start at 1 for a connector that did not exist (deletion removes its versions).
    return StoredConnector(config.name, version, version == 1, config)


def pause_connector(store: Store, name: str) -> None:
    store.set_connector_state(name, ConnectorState.PAUSED)


def resume_connector(store: Store, name: str) -> None:
    store.set_connector_state(name, ConnectorState.RUNNING)


def restart_connector(store: Store, name: str) -> None:
    """Running tasks recreate their clients in place from their committed offsets (one marker per connector)."""
    store.request_restart(name)


def delete_connector(store: Store, name: str) -> None:
    if not store.delete_connector(name):
        raise UnknownConnectorError(f"connector {name!r} does not exist")


MAX_PAUSE_REASON_CHARS = 1_000


def pause_partition(store: Store, name: str, tp: SourcePartition, reason: str) -> None:
    """Pause one source partition the connector replicates, with the operator's reason, until `resume_partition`:
    its task stops reading it within a second, keeps what it acknowledged, and keeps it paused across restarts.
    `PartitionPauseError` (a partition it does not replicate, no reason) changes nothing."""
    reason = reason.strip()
    if not reason:
        raise PartitionPauseError("a reason is required: operators see it next to the paused partition")
    if len(reason) > MAX_PAUSE_REASON_CHARS:
        raise PartitionPauseError(f"the reason is {len(reason)} characters long, at most {MAX_PAUSE_REASON_CHARS}")
    store.get_connector(name)  # UnknownConnectorError first
    assigned = {p for partitions in store.read_assignment(name).values() for p in partitions}
    if tp not in assigned:
        topics = sorted({topic for topic, _ in assigned})
        shown = ", ".join(topics[:10]) + (f" (+{len(topics) - 10} more)" if len(topics) > 10 else "")
        raise PartitionPauseError(
            f"connector {name!r} does not replicate {tp[0]}[{tp[1]}]: its assignment holds {len(assigned)} "
            f"partition(s){' of ' + shown if shown else ''}"
        )
    store.pause_partition(name, tp, reason)


def resume_partition(store: Store, name: str, tp: SourcePartition) -> bool:
    """Lift an operator's pause: the task reads the partition again from its first unacknowledged offset. Whether
    it was paused."""
    return store.resume_partition(name, tp)


def alter_offsets(store: Store, name: str, offsets: Mapping[SourcePartition, int | None] | None) -> None:
    """Set (None: forget) a paused connector's offsets, or forget them all; `ConnectorNotStoppedError` otherwise."""
    store.alter_offsets_of_stopped(name, offsets, _lease_timeout(store.get_connector(name).properties)[0])


def group_offsets(store: Store, name: str, group: str) -> dict[SourcePartition, int]:
    """A consumer group's committed offsets on the connector's source cluster, for the partitions it selects.

    This is how a MirrorMaker deployment is taken over: MirrorMaker's consumer group positions are exactly
    "the next source offset to replicate". Partitions the group never committed are left out. Nothing joins the
    group (offsets are fetched, not consumed), so a running MirrorMaker is not disturbed.
    """
    config = load(store.get_connector(name).properties)
    topics = read_cluster(ClusterAdmin(config.admin_settings("source")), "source").partition_counts()
    wanted = [TopicPartition(t, p) for t in config.selector.select(topics) for p in range(topics[t])]
    if not wanted:
        return {}
    consumer = Consumer({**config.admin_settings("source"), "group.id": group, "enable.auto.commit": False})
    try:
        committed = consumer.committed(wanted, timeout=METADATA_TIMEOUT_S)
    except KafkaException as exc:
        raise MetadataUnavailableError(f"committed offsets of group {group!r} unavailable: {exc}") from exc
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): tp.offset for tp in committed if tp.error is None and tp.offset >= 0}


# -- status, as Kafka Connect reports it ------------------------------------------------------------------

# Kafka Connect's task states.
TASK_RUNNING, TASK_PAUSED, TASK_FAILED, TASK_UNASSIGNED = "RUNNING", "PAUSED", "FAILED", "UNASSIGNED"


@dataclass(frozen=True)
class ConnectTaskStatus:
    task_id: int
    state: str  # RUNNING, PAUSED, FAILED or UNASSIGNED
    worker: str  # the lease owner (host:pid:run), "" when no instance ever ran
    trace: str | None


# Why a partition is paused, as `mirus_partitions_paused` labels it.
CAUSE_RECORD_TOO_LARGE, CAUSE_OPERATOR, CAUSE_OTHER = "record_too_large", "operator", "other"
PAUSE_CAUSES = (CAUSE_RECORD_TOO_LARGE, CAUSE_OPERATOR, CAUSE_OTHER)


@dataclass(frozen=True)
class StoppedPartition:
    """A source partition that does not replicate: paused (by its task, the monitor or an operator) or dropped."""

    topic: str
    partition: int
    state: str  # PAUSED or DROPPED
    reason: str
    since: datetime
    task_id: int | None

    @property
    def cause(self) -> str:
        """What it waits for, by its reason: every refusal for a record's size names a size limit."""
        if self.reason.startswith(OPERATOR_PAUSE):
            return CAUSE_OPERATOR
        if "max.message.bytes" in self.reason or "MSG_SIZE_TOO_LARGE" in self.reason:
            return CAUSE_RECORD_TOO_LARGE
        return CAUSE_OTHER


@dataclass(frozen=True)
class ConnectStatus:
    name: str
    state: str  # RUNNING, PAUSED, or FAILED while the monitor cannot read a cluster's metadata
    trace: str | None
    tasks: list[ConnectTaskStatus]
    partitions: list[StoppedPartition] = field(default_factory=list)  # the partitions that do not replicate


def stopped_partitions(status: ConnectorStatus) -> list[StoppedPartition]:
    """`status`'s partitions paused or dropped (`partition_status`) and those an operator paused, with why."""
    stopped = {
        tp: StoppedPartition(tp[0], tp[1], row.state.value, row.reason or "", row.updated_at, row.task_id)
        for tp, row in status.unhealthy_partitions.items()
    }
    for tp, pause in status.operator_pauses.items():  # the operator's pause is what an operator must lift first
        task_id = stopped[tp].task_id if tp in stopped else None
        reason = f"{OPERATOR_PAUSE}: {pause.reason}"
        stopped[tp] = StoppedPartition(tp[0], tp[1], PartitionHealth.PAUSED.value, reason, pause.paused_at, task_id)
    return [stopped[tp] for tp in sorted(stopped)]


def connect_statuses(store: Store, name: str | None = None, now: datetime | None = None) -> list[ConnectStatus]:
    """Every connector's (or `name`'s) state and its tasks' states, derived from `Store.connector_statuses`.

    A task is RUNNING while its lease is held and heartbeats within `task.lease.timeout.ms`; FAILED when its
    last instance failed or went silent; PAUSED when the connector is; UNASSIGNED while it waits for a run.
    """
    now = now or datetime.now(UTC)
    out = []
    for status in store.connector_statuses(name):
        errors = [f"{cluster} metadata: {error}" for cluster, error in sorted(status.metadata_errors.items())]
        stale, config_error = _lease_timeout(status.properties)
        errors += [config_error] if config_error else []
        tasks = []
        for task in status.tasks:
            state, trace = TASK_UNASSIGNED, None
            if status.state == ConnectorState.PAUSED:
                state = TASK_PAUSED
            elif task.state == "FAILED":
                state, trace = TASK_FAILED, task.error
            elif task.state == LEASE_HELD:
                beat = task.heartbeat_at
                if beat is not None and now - beat <= stale:
                    state = TASK_RUNNING
                else:
                    state, trace = TASK_FAILED, f"no heartbeat since {beat.isoformat() if beat else 'the claim'}"
            tasks.append(ConnectTaskStatus(task.task_id, state, task.owner or "", trace))
        state = status.state.value if status.state == ConnectorState.PAUSED or not errors else "FAILED"
        out.append(ConnectStatus(status.name, state, "\n".join(errors) or None, tasks, stopped_partitions(status)))
    return out


def _lease_timeout(properties: Mapping[str, object]) -> tuple[timedelta, str | None]:
    """A stored config's `task.lease.timeout.ms`, read without its secrets (this process may not have them); the
    default, and why, if the config no longer loads under today's rules."""
    try:
        return timedelta(milliseconds=load(properties, resolve_references=False).task_lease_timeout_ms), None
    except ConnectorConfigError as exc:
        default = timedelta(milliseconds=ConnectorConfig.model_fields["task_lease_timeout_ms"].default)
        return default, f"stored configuration no longer loads: {exc}"


def connect_status(store: Store, name: str) -> ConnectStatus:
    found = connect_statuses(store, name)
    if not found:
        raise UnknownConnectorError(f"connector {name!r} does not exist")
    return found[0]
