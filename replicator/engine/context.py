"""What a task's parts share: `TaskContext`, which `ReplicationTask` is.

Parts are built with the parts they use (`ReplicationTask.__init__` and `rebuild` wire them) and never reach another
through the task, but for one reason: `rebuild` makes the clients again for a new configuration version (the source
reader, the deliveries, the forwarder and the committer around them) while the parts that outlive it (the assignment
follower, the destinations, the partition pauses) must use the current ones. Those reach them here: the reader, the
deliveries, and the committer by the few methods the follower uses (`Committing`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from replicator.assignment import SourcePartition
from replicator.configuration.connector import ConnectorConfig
from replicator.engine.deliveries import Deliveries
from replicator.engine.metrics import TaskMetrics
from replicator.engine.partitions import PartitionBook
from replicator.engine.record_limits import RecordLimits
from replicator.engine.scheduler import Scheduler
from replicator.engine.source_reader import SourceReader
from replicator.state.records import Lease
from replicator.state.store import Store


class Committing(Protocol):
    """A committer (`replicator.engine.committer`), as the follower uses it."""

    def resume(self, partitions: list[SourcePartition], stored: dict[SourcePartition, int]) -> set[SourcePartition]: ...
    def claimed_from(self, silent_tasks: set[int]) -> None: ...
    def commit_now(self, final: bool = False) -> None: ...


class TaskContext(Protocol):
    """What the parts share: the task's identity, store and lease, its configuration and current clients, the
    partition book, the scheduler and the background thread."""

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
    clients_open: bool
    version: int
    restart_marker: object

    @property
    def committer(self) -> Committing: ...  # the current one (`rebuild`), as the follower uses it

    def rebuild(self, version: int, restart_marker: object, why: str | None = None) -> None: ...
