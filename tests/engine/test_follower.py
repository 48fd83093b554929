"""The assignment follower on its own: a task whose clients are made by hand (a source reader, deliveries and a
committer on the session's clusters, the store), never run, and a follower built with its partition pauses,
destinations and a throttle's share. No records are copied: the follower claims, starts, releases and retries
partitions."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.configuration.connector import load
from replicator.engine.deliveries import Deliveries
from replicator.engine.follower import AssignmentFollower, TaskExit
from replicator.engine.source_reader import SourceReader
from replicator.engine.task import ReplicationTask
from replicator.engine.throttle import ThrottleShare
from replicator.state.records import PartitionHealth
from replicator.state.store import Store
from tests.fixtures.engine_helpers import connector_properties, create_connector
from tests.fixtures.kafka_helpers import cluster_id, create_topics, produce


@pytest.fixture
def events() -> list[str]:
    return []


@pytest.fixture
def task(stack: StackEndpoints, store: Store, unique: str, events: list[str]) -> Iterator[ReplicationTask]:
    """Task 0 of a connector over `unique` (three partitions at both ends), assigned partitions 0 and 1, with its
    lease and clients made as `ReplicationTask.rebuild` makes them for the connector's current version."""
    create_topics(stack.source_bootstrap_servers, {unique: 3})
    create_topics(stack.destination_bootstrap_servers, {unique: 3})
    create_connector(
        store,
        connector_properties(stack, unique, **{"topics.whitelist": unique}),
        {0: [(unique, 0), (unique, 1)], 1: [(unique, 2)]},
    )
    task = ReplicationTask(store, unique, 0, "test", on_event=events.append)
    task.lease = store.claim_task(unique, 0, "test")
    head = store.connector_head(unique)
    assert head is not None
    task.version, task.restart_marker = head.version, head.restart_requested_at
    task.config = config = load(store.get_connector(unique).properties)
    task.source_cluster = cluster_id(stack.source_bootstrap_servers)
    task.limits.serve(config, {unique}, only=True)
    task.limits.learn(config)
    consumer, producer = task.limits.client_settings(config, 0)
    task.sized_for = task.limits.sizes_of(config, 0)
    task.reader = SourceReader(consumer)
    task.deliveries = Deliveries(
        producer, task.book, task.metrics,
        ordered_acks=config.ordered_acks, grouped=True, idle_close_s=60.0, name=unique,
    )  # fmt: skip
    task.clients_open = True  # the committer the task was made with serves: it reads the configuration through the task
    try:
        yield task
    finally:
        task.close_clients()
        task.background.shutdown()


def _follower(task: ReplicationTask) -> AssignmentFollower:
    return AssignmentFollower(task, task.pauses, task.destinations, ThrottleShare())


def _read(reader: SourceReader, count: int) -> list[int]:
    """The offsets of the next `count` records the reader gives."""
    offsets: list[int] = []

    def enough() -> bool:
        offsets.extend(record.offset() for record in reader.consume(count, 0.2))
        return len(offsets) >= count

    wait_until(enough, what=f"{count} records read")
    return offsets


def test_a_new_assignment_generation_releases_the_partitions_removed_committed_and_claims_those_added(
    task: ReplicationTask, store: Store, unique: str, events: list[str]
) -> None:
    follower = _follower(task)
    assert follower.refresh(store.connector_head(unique)) is None
    assert sorted(task.book.states) == [(unique, 0), (unique, 1)]
    assert events[-1] == f"replicating 2 partition(s): {unique}[0], {unique}[1]"
    moved = task.book.states[(unique, 0)]
    moved.skipped(4)  # acknowledged up to 5, not yet committed
    store.write_assignment(unique, {0: [(unique, 1), (unique, 2)], 1: [(unique, 0)]})
    assert follower.refresh(store.connector_head(unique)) is None
    assert sorted(task.book.states) == [(unique, 1), (unique, 2)]
    assert set(task.reader.shard) == {(unique, 1), (unique, 2)}
    assert store.load_offsets(unique)[(unique, 0)] == 5, "committed before it was released"
    owners = {tp: status.task_id for tp, status in store.partition_statuses(unique).items()}
    assert owners == {(unique, 0): None, (unique, 1): 0, (unique, 2): 0}
    assert events[-2:] == [
        f"released 1 partition(s): {unique}[0]",
        f"replicating 1 partition(s): {unique}[2]",
    ]
    store.write_assignment(unique, {1: [(unique, 0), (unique, 1), (unique, 2)]})
    assert follower.refresh(store.connector_head(unique)) is TaskExit.REMOVED


def test_a_paused_partition_is_retried_after_its_backoff_from_its_first_unacknowledged_record(
    task: ReplicationTask, stack: StackEndpoints, store: Store, unique: str, events: list[str]
) -> None:
    produce(stack.source_bootstrap_servers, [{"topic": unique, "partition": 0, "value": b"%d" % i} for i in range(3)])
    follower = _follower(task)
    follower.refresh(store.connector_head(unique))
    tp = (unique, 0)
    assert _read(task.reader, 3) == [0, 1, 2]
    state = task.book.states[tp]
    run = state.open(0)  # the three records produced as one run, which the destination refused
    for offset in range(3):
        run.add(offset, 1, 0)
    state.sent(run)
    state.unanswered(run)
    task.pauses.pause(state, "destination refused offset 0")
    assert tp in task.book.paused and tp in task.reader.paused
    follower.tick(state.retry_at - 0.001)
    assert state.paused_reason is not None, "not before its backoff is over"
    follower.tick(state.retry_at)
    assert state.paused_reason is None and tp not in task.book.paused and tp not in task.reader.paused
    assert events[-1] == f"resumed {unique}[0] at offset 0 (was: destination refused offset 0)"
    assert store.partition_statuses(unique)[tp].state is PartitionHealth.ACTIVE
    assert _read(task.reader, 3) == [0, 1, 2], "read again from the first record the destination did not acknowledge"
