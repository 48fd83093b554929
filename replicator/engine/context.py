"""How a task's parts see the task and each other: what each part asks of the others, and what they share.

`ReplicationTask` is the one `TaskContext`; the forwarder, the committers and the assignment follower know it, and
each other, only by these protocols: none of them imports the task, and only exactly-once mode's committer
(`transactions.py`) imports another part (it extends `Committer` and shares the forwarder's wait bounds).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from confluent_kafka.admin import AdminClient

from replicator.assignment import SourcePartition
from replicator.clusters import TopicPartitions
from replicator.configuration.connector import ConnectorConfig
from replicator.engine.deliveries import Deliveries
from replicator.engine.metrics import TaskMetrics
from replicator.engine.partitions import PartitionBook
from replicator.engine.record_limits import RecordLimits
from replicator.engine.scheduler import Scheduler
from replicator.engine.source_reader import SourceReader
from replicator.state.records import Lease
from replicator.state.store import Store


class Forwarding(Protocol):
    """The forwarder (`replicator.engine.forwarder`), as the follower uses it."""

    def rethrottle(self, config: ConnectorConfig, tasks: int) -> None: ...


class Committing(Protocol):
    """A committer (`replicator.engine.committer`), as the follower uses it."""

    def resume(self, partitions: list[SourcePartition], stored: dict[SourcePartition, int]) -> set[SourcePartition]: ...
    def claimed_from(self, silent_tasks: set[int]) -> None: ...
    def commit_now(self, final: bool = False) -> None: ...


class Following(Protocol):
    """The assignment follower (`replicator.engine.follower`), as the committers use it."""

    def destination_layouts(self, topics: set[str]) -> dict[str, TopicPartitions]: ...
    def destination_admin(self) -> AdminClient: ...
    def reset_offsets(self, partitions: list[SourcePartition]) -> dict[SourcePartition, int]: ...


class TaskContext(Protocol):
    """What the parts share: the task's identity, store and lease, its configuration and clients, the partition
    book, the scheduler and the background thread, and the other parts."""

    connector: str
    task_id: int
    store: Store
    lease: Lease
    config: ConnectorConfig
    reader: SourceReader
    deliveries: Deliveries
    book: PartitionBook
    limits: RecordLimits  # the record size limits of the topics served
    sized_for: tuple[object, ...]  # the size settings the clients were made with (`RecordLimits.sizes_of`)
    metrics: TaskMetrics
    scheduler: Scheduler
    head_changed: threading.Event  # Postgres said the connector's row changed: read it at the loop's next turn
    background: ThreadPoolExecutor
    on_event: Callable[[str], None]
    should_stop: Callable[[], bool]  # the process or run is stopping: long waits of a start give up
    source_cluster: str
    destination_cluster: str
    origin_header: tuple[str, bytes]
    clients_open: bool
    version: int
    restart_marker: object

    @property
    def forwarder(self) -> Forwarding: ...
    @property
    def committer(self) -> Committing: ...
    @property
    def follower(self) -> Following: ...

    def rebuild(self, version: int, restart_marker: object, why: str | None = None) -> None: ...
