"""How a task's parts see the task and each other: what each part asks of the others, and what they share.

`ReplicationTask` is the one `TaskContext`; the forwarder, the committers and the assignment follower know it, and
each other, only by these protocols: none of them imports the task, and only exactly-once mode's committer
(`transactions.py`) imports another part (it extends `Committer` and shares the forwarder's wait bounds).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, Protocol

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient

from replicator.assignment import SourcePartition
from replicator.clusters import TopicPartitions
from replicator.configuration.connector import ConnectorConfig
from replicator.engine.metrics import TaskMetrics
from replicator.engine.partitions import PartitionBook, PartitionState
from replicator.engine.record_limits import RecordLimits
from replicator.engine.scheduler import Scheduler
from replicator.engine.source_reader import SourceReader
from replicator.state.records import Lease
from replicator.state.store import Store


class Forwarding(Protocol):
    """The forwarder (`replicator.engine.forwarder`), as the committers and the follower use it."""

    fatal_error: KafkaError | None
    unsettled: bool

    @property
    def producer(self) -> Producer: ...
    def producer_of(self, topic: str) -> Producer | None: ...
    def route(self, state: PartitionState, partition: int, destination_partitions: int) -> None: ...
    def replace_producers(self) -> None: ...
    def serve(self, timeout: float) -> None: ...
    def drain(self, timeout: float) -> None: ...
    def settle(self, delivered: bool) -> None: ...
    def purge(self) -> None: ...
    def recreate_producer(self, err: KafkaError) -> None: ...
    def rethrottle(self) -> None: ...


class Committing(Protocol):
    """A committer (`replicator.engine.committer`), as the forwarder and the follower use it."""

    def accepting(self) -> bool: ...
    def serve_wait_s(self) -> float: ...
    def refusal_counts(self, state: PartitionState, offset: int, err: KafkaError) -> bool: ...
    def producer_failed(self, err: KafkaError) -> None: ...
    def resume(self, partitions: list[SourcePartition], stored: dict[SourcePartition, int]) -> set[SourcePartition]: ...
    def claimed_from(self, silent_tasks: set[int]) -> None: ...
    def commit_now(self, final: bool = False) -> None: ...


class Following(Protocol):
    """The assignment follower (`replicator.engine.follower`), as the forwarder and the committers use it."""

    tasks: int  # how many tasks the connector's assignment has: each gets its share of the throttle

    def source_error(self, msg: Message) -> None: ...
    def pause(self, state: PartitionState, reason: str) -> None: ...
    def read_again(self, state: PartitionState) -> int | None: ...
    def destination_layouts(self, topics: set[str]) -> dict[str, TopicPartitions]: ...
    def destination_admin(self) -> AdminClient: ...
    def refused_by(
        self, cluster: Literal["source", "destination"], doing: str, err: KafkaError, needed: tuple[str, str]
    ) -> str: ...
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
