"""The task's parts on their own: the partition book's positions, acknowledgements and pauses, the scheduler of
named duties, what each committer writes to Postgres (a real store; no records flow), and which consumer the source
reader gives each partition it starts."""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from mirus_dagster.settings import StackEndpoints
from replicator.engine.committer import UNTOUCHED_RESCAN_S, Committer
from replicator.engine.partitions import RETRY_BACKOFF_S, InFlight, PartitionBook, PartitionState
from replicator.engine.scheduler import Scheduler
from replicator.engine.source_reader import SourceReader, TierLimits
from replicator.engine.transactions import TransactionalCommitter
from replicator.state.store import Store
from tests.fixtures.engine_helpers import connector_properties, create_connector, wire_parts
from tests.fixtures.kafka_helpers import create_topics


def _state(partition: int = 0, start: int | None = 10) -> PartitionState:
    return PartitionState(("t", partition), start, "t.copy", "cluster-a")


def _produced(state: PartitionState, first: int, count: int) -> InFlight:
    """A run of `count` records from `first`, produced and sent whole (the forwarder's calls)."""
    run = state.open(first)
    for offset in range(first, first + count):
        run.add(offset, 100, 0)
    state.sent(run)
    return run


def test_a_partition_commits_up_to_its_first_unacknowledged_record() -> None:
    state = _state(start=10)
    assert state.first_unacknowledged() == 10
    first, second = _produced(state, 10, 5), _produced(state, 15, 5)
    assert state.first_unacknowledged() == 10 and state.in_flight == 10, "nothing acknowledged yet"
    state.acknowledged(second, None)  # acknowledged out of order: still held by the first run
    assert state.first_unacknowledged() == 10
    state.acknowledged(first, None)
    assert state.first_unacknowledged() == 20 and state.in_flight == 0 and not state.pending
    third = _produced(state, 20, 5)
    state.refused(22, too_large=False)  # a refusal inside the run: everything from it is sent again
    state.unanswered(third)
    assert state.first_unacknowledged() == 20
    state.read_again()
    fourth = _produced(state, 20, 2)
    state.acknowledged(fourth, None)
    state.refused(12, too_large=False)  # a refusal below the head: everything from it is sent again
    assert state.first_unacknowledged() == 12


def test_the_destination_offset_a_commit_stores_never_passes_a_copy_still_unacknowledged() -> None:
    """A start resumes at the stored source offset and skips the copies it finds from the stored destination offset
    on: a destination offset past copies that came before an unanswered run would make them written twice."""
    state = _state(start=10)
    state.route(0, ordered_acks=True)
    timed_out, delivered = _produced(state, 10, 5), _produced(state, 15, 5)
    state.acknowledged(delivered, 104)  # delivered (at destination offsets 100..104) behind a run not answered
    state.unanswered(timed_out)
    assert state.first_unacknowledged() == 10
    assert state.next_destination_offset is None, "nothing known where source offset 10's copy goes"
    state.read_again()  # a new producer sends both runs again
    again = _produced(state, 10, 10)
    state.acknowledged(again, 114)
    assert (state.first_unacknowledged(), state.next_destination_offset) == (20, 115)
    first, second = _produced(state, 20, 5), _produced(state, 25, 5)
    state.acknowledged(second, 124)
    assert (state.first_unacknowledged(), state.next_destination_offset) == (20, 115), "held by the first run"
    state.acknowledged(first, 119)
    assert (state.first_unacknowledged(), state.next_destination_offset) == (30, 125)


def test_reading_again_starts_at_the_first_unacknowledged_record_and_forgets_what_was_in_flight() -> None:
    book, state = PartitionBook(), _state(start=0)
    book.add(state)
    _produced(state, 0, 3)
    _produced(state, 3, 3)
    assert state.read_again() == 0
    assert not state.pending and state.next_offset == 0 and state.refused_from is None


def test_a_paused_partition_backs_off_longer_each_time_until_progress_is_committed() -> None:
    book, state = PartitionBook(), _state()
    book.add(state)
    waits = []
    for _ in range(len(RETRY_BACKOFF_S) + 2):
        before = time.monotonic()
        book.pause(state, "refused")
        waits.append(round(state.retry_at - before))
        assert book.paused == {state.tp: state}
        assert book.unpause(state) == "refused" and book.paused == {} and state.paused_reason is None
    assert waits == [1, 2, 4, 8, 16, 30, 60, 60, 60]
    book.pause(state, "refused")
    assert book.due_for_retry(state.retry_at - 0.001) == []
    assert book.due_for_retry(state.retry_at) == [state]
    unanswered = _produced(state, 10, 1)  # a record still unanswered: not retried before its answer
    assert book.due_for_retry(state.retry_at) == []
    state.unanswered(unanswered)
    book.unpause(state)
    book.committed({state.tp: 11})
    assert state.committed_offset == 11 and state.failures == 0, "progress starts the backoff over"


def test_only_partitions_that_moved_are_committed() -> None:
    book = PartitionBook()
    moved, idle = _state(0, start=10), _state(1, start=20)
    book.add(moved)
    book.add(idle)
    moved.acknowledged(_produced(moved, 10, 5), None)
    assert book.changed(PartitionState.first_unacknowledged) == {("t", 0): 15}
    book.committed({("t", 0): 15})
    assert book.changed(PartitionState.first_unacknowledged) == {}


def test_the_scheduler_runs_a_named_duty_once_per_interval() -> None:
    scheduler = Scheduler()
    assert scheduler.due("committing", 1.0, now=100.0), "a duty not yet run is due at once"
    assert not scheduler.due("committing", 1.0, now=100.5)
    assert scheduler.due("committing", 1.0, now=101.0)
    assert scheduler.due("refreshing", 0.5, now=101.0), "duties are timed apart"
    scheduler.ran("heartbeating", 2.0, now=101.0)
    assert not scheduler.due("heartbeating", 2.0, now=102.9)
    assert scheduler.due("heartbeating", 2.0, now=103.0)


@pytest.mark.parametrize("committer", [Committer, TransactionalCommitter], ids=["at-least-once", "exactly-once"])
def test_each_committer_writes_what_its_mode_makes_durable(
    stack: StackEndpoints, store: Store, unique: str, committer: type[Committer]
) -> None:
    extra = {"exactly.once.support": "required"} if committer is TransactionalCommitter else {}
    create_connector(
        store,
        connector_properties(stack, unique, **{"topics.whitelist": unique, **extra}),
        {0: [(unique, 0), (unique, 1)]},
    )
    parts = wire_parts(store, unique)
    part = parts.committer
    assert type(part) is committer, "the delivery mode's"
    acknowledged, untouched = PartitionState((unique, 0), 0, unique, "a"), PartitionState((unique, 1), 5, unique, "a")
    parts.book.add(acknowledged)
    parts.book.add(untouched)
    acknowledged.route(0, ordered_acks=True)  # its acknowledgements say where its copies are
    acknowledged.acknowledged(_produced(acknowledged, 0, 25), 6)  # a transaction committed 25 records ...
    acknowledged.made_durable()
    acknowledged.acknowledged(_produced(acknowledged, 25, 15), 21)  # ... of 40 acknowledged
    part.commit_now()
    expected = 40 if committer is Committer else 25
    assert store.load_offsets(unique) == {(unique, 0): expected}, "only the partition that moved"
    assert acknowledged.committed_offset == expected
    destination = store.load_destination_offsets(unique, [(unique, 0)])
    # Where the next copy goes: after the last acknowledged one (at least once), the last committed one (exactly once).
    assert destination == {(unique, 0): 22 if committer is Committer else 7}
    parts.close()


def test_an_idle_tasks_commit_visits_its_partitions_only_after_a_read_or_an_acknowledgement(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    create_connector(store, connector_properties(stack, unique, **{"topics.whitelist": unique}), {0: [(unique, 0)]})
    parts = wire_parts(store, unique)
    book, part = parts.book, parts.committer
    state = PartitionState((unique, 0), 0, unique, "a")
    book.add(state)

    def commit() -> dict[tuple[str, int], int]:
        part.commit_in_background()
        part.collect(wait=True)
        return store.load_offsets(unique)

    state.acknowledged(_produced(state, 0, 10), None)
    book.touched += 1  # a batch read (the forwarder counts each, and each acknowledged run)
    assert commit() == {(unique, 0): 10}
    # Moved with nothing counted: the commit is a heartbeat, no partition is visited ...
    state.acknowledged(_produced(state, 10, 10), None)
    assert commit() == {(unique, 0): 10}
    book.touched += 1  # ... until the next read or acknowledgement
    assert commit() == {(unique, 0): 20}
    state.acknowledged(_produced(state, 20, 10), None)
    assert part.scanned is not None
    part.scanned = (part.scanned[0], part.scanned[1] - UNTOUCHED_RESCAN_S)  # or until the rescan period passed
    assert commit() == {(unique, 0): 30}
    parts.close()


def test_the_source_reader_fetches_eagerly_a_few_partitions_and_those_known_to_flow(
    stack: StackEndpoints, unique: str
) -> None:
    # A quiet consumer given many partitions at once waits out its first fetch (500 ms when they are idle) before
    # the rest join: a takeover's flowing partitions and a new topic's few get consumers that answer at once.
    create_topics(stack.source_bootstrap_servers, {unique: 6, f"{unique}-new": 1})
    reader = SourceReader(
        {"bootstrap.servers": stack.source_bootstrap_servers, "group.id": unique, "enable.auto.commit": False},
        TierLimits(eager_start_partitions=2),
    )
    try:
        reader.assign([TopicPartition(unique, p, 0) for p in range(6)], eager={(unique, 4)})
        assert reader.shard[(unique, 4)].tier is reader.flowing
        assert reader.assigned_in(reader.quiet) == 5
        reader.assign([TopicPartition(f"{unique}-new", 0, 0)])  # no more than eager_start_partitions
        assert reader.shard[(f"{unique}-new", 0)].tier is reader.flowing
    finally:
        reader.close()


# Fields of the ledger's with names no other class of the project uses: a write to one of them on any receiver is a
# write to the ledger. Names other classes share are caught on receivers named as the engine names ledger entries.
LEDGER_NAMES = {"state", "ustate", "run", "moved", "acknowledged", "refused", "failed", "purged"}
SHARED_NAMES = {
    "count", "destination_topic", "done", "failures", "first", "in_flight", "last", "partition", "produce", "retry_at",
    "size", "timestamps", "topic", "tp",
}  # fmt: skip


def _ledger_writes(source: str) -> list[str]:
    """Writes to PartitionState's or InFlight's fields in `source`: assignments, and mutating calls on the ledger's
    collections (state.pending.append, run.timestamps.append); as 'line receiver.field'."""
    fields = set(PartitionState.__slots__) | set(InFlight.__slots__)
    writes = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            for target in node.targets:
                targets += target.elts if isinstance(target, ast.Tuple) else [target]
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            inner = node.func.value
            if isinstance(inner, ast.Attribute) and inner.attr in {"pending", "timestamps"}:
                targets = [inner]
        for target in targets:
            if not isinstance(target, ast.Attribute) or target.attr not in fields:
                continue
            receiver = target.value.id if isinstance(target.value, ast.Name) else ""
            if target.attr not in SHARED_NAMES or receiver in LEDGER_NAMES:
                writes.append(f"{target.lineno} {receiver}.{target.attr}")
    return writes


def test_the_ledger_changes_only_through_its_own_methods() -> None:
    """PartitionState's and InFlight's fields are written in replicator/engine/partitions.py alone: elsewhere the
    parts call the ledger's methods (open, add, sent, acknowledged, refused, paused_for, read_again, committed)."""
    root = Path(__file__).resolve().parents[2] / "replicator"
    writes = [
        f"{path.relative_to(root.parent)}:{write}"
        for path in sorted(root.rglob("*.py"))
        if path != root / "engine" / "partitions.py"
        for write in _ledger_writes(path.read_text())
    ]
    assert writes == []
    assert _ledger_writes((root / "engine" / "partitions.py").read_text()), "the ledger's own writes are found"


def test_a_write_to_the_ledger_from_outside_is_found() -> None:
    source = (
        "ustate.next_offset = uoffset + 1\n"
        "state.in_flight += 1\n"
        "run.count, state.failures = 3, 0\n"
        "state.pending.append(run)\n"
        "hosted.failures = 0\n"  # another class's field of the same name, on a receiver that is no ledger entry
    )
    assert _ledger_writes(source) == [
        "1 ustate.next_offset", "2 state.in_flight", "3 run.count", "3 state.failures", "4 state.pending",
    ]  # fmt: skip


def test_a_task_process_on_the_record_path_loads_neither_the_batch_paths_client_nor_alembic() -> None:
    """A task's start is mostly Python's imports: kafka-python (the batch path's client) and Alembic (migrations) are
    each a tenth of a second of it, and a task on the record path with a migrated schema uses neither."""
    program = (
        "import sys; import mirus.cli.main, replicator.engine.ownership, replicator.engine.task, "
        "replicator.state.database, replicator.state.head_notices, replicator.state.store; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'kafka', 'alembic'}))"
    )
    loaded = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr
