"""The assignment follower on its own: built from its collaborators with a committer, partition pauses and
destinations around clients made for the connector (`wire_parts`, on the session's clusters and the store; no task).
No records are copied: the follower claims, starts, releases and retries partitions."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.engine.follower import TaskExit
from replicator.engine.source_reader import SourceReader
from replicator.state.records import PartitionHealth
from replicator.state.store import Store
from tests.fixtures.engine_helpers import Parts, connector_properties, create_connector, wire_parts
from tests.fixtures.kafka_helpers import cluster_id, create_topics, produce


@pytest.fixture
def parts(stack: StackEndpoints, store: Store, unique: str) -> Iterator[Parts]:
    """Task 0 of a connector over `unique` (three partitions at both ends), assigned partitions 0 and 1, its parts
    wired around clients made for the connector's current version."""
    create_topics(stack.source_bootstrap_servers, {unique: 3})
    create_topics(stack.destination_bootstrap_servers, {unique: 3})
    create_connector(
        store,
        connector_properties(stack, unique, **{"topics.whitelist": unique}),
        {0: [(unique, 0), (unique, 1)], 1: [(unique, 2)]},
    )
    ids = (cluster_id(stack.source_bootstrap_servers), cluster_id(stack.destination_bootstrap_servers))
    parts = wire_parts(store, unique, ids)
    try:
        yield parts
    finally:
        parts.close()


def _read(reader: SourceReader, count: int) -> list[int]:
    """The offsets of the next `count` records the reader gives."""
    offsets: list[int] = []

    def enough() -> bool:
        offsets.extend(record.offset() for record in reader.consume(count, 0.2))
        return len(offsets) >= count

    wait_until(enough, what=f"{count} records read")
    return offsets


def test_a_new_assignment_generation_releases_the_partitions_removed_committed_and_claims_those_added(
    parts: Parts, store: Store, unique: str
) -> None:
    follower, events = parts.follower, parts.events
    assert follower.refresh(store.connector_head(unique)) is None
    assert sorted(parts.book.states) == [(unique, 0), (unique, 1)]
    assert events[-1] == f"replicating 2 partition(s): {unique}[0], {unique}[1]"
    moved = parts.book.states[(unique, 0)]
    moved.skipped(4)  # acknowledged up to 5, not yet committed
    store.write_assignment(unique, {0: [(unique, 1), (unique, 2)], 1: [(unique, 0)]})
    assert follower.refresh(store.connector_head(unique)) is None
    assert sorted(parts.book.states) == [(unique, 1), (unique, 2)]
    assert set(parts.reader.shard) == {(unique, 1), (unique, 2)}
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
    parts: Parts, stack: StackEndpoints, store: Store, unique: str
) -> None:
    produce(stack.source_bootstrap_servers, [{"topic": unique, "partition": 0, "value": b"%d" % i} for i in range(3)])
    follower, events = parts.follower, parts.events
    follower.refresh(store.connector_head(unique))
    tp = (unique, 0)
    assert _read(parts.reader, 3) == [0, 1, 2]
    state = parts.book.states[tp]
    run = state.open(0)  # the three records produced as one run, which the destination refused
    for offset in range(3):
        run.add(offset, 1, 0)
    state.sent(run)
    state.unanswered(run)
    parts.pauses.pause(state, "destination refused offset 0")
    assert tp in parts.book.paused and tp in parts.reader.paused
    follower.tick(state.retry_at - 0.001)
    assert state.paused_reason is not None, "not before its backoff is over"
    follower.tick(state.retry_at)
    assert state.paused_reason is None and tp not in parts.book.paused and tp not in parts.reader.paused
    assert events[-1] == f"resumed {unique}[0] at offset 0 (was: destination refused offset 0)"
    assert store.partition_statuses(unique)[tp].state is PartitionHealth.ACTIVE
    assert _read(parts.reader, 3) == [0, 1, 2], "read again from the first record the destination did not acknowledge"
