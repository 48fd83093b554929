"""Owner and warm standby of one task on real clusters and Postgres: the standby never writes while the owner's
lease is valid, takes over when the owner dies or falls silent, and nothing is lost or reordered across it."""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.engine.ownership import LockWatch, TaskOwnership
from replicator.state.epoch_locks import epoch_lock_key
from replicator.state.records import FencedError, Lease
from replicator.state.store import Store
from tests.fixtures.engine_helpers import connector_properties, create_connector
from tests.fixtures.kafka_helpers import Traffic, create_topics
from tests.fixtures.processes import ReplicatorProcess
from tests.fixtures.replica_check import ReplicaReport, check_replica

PARTITIONS = 2
LEASE_TIMEOUT = timedelta(seconds=30)  # the connectors' default (task.lease.timeout.ms)


def offset_epochs(store: Store, connector: str) -> set[int]:
    with store.engine.connect() as conn:
        return set(conn.execute(text("SELECT epoch FROM offsets WHERE connector = :c"), {"c": connector}).scalars())


def epoch_of(store: Store, connector: str) -> int:
    lease = store.lease_of(connector, 0)
    return lease.epoch if lease else 0


def three_waits_of_a_heartbeating_owner(store: Store, lease: Lease) -> Callable[[], bool]:
    """A standby's `should_stop` that lets it wait three times on the owner's lock (up to a second each), the owner
    heartbeating before each."""
    rounds = 0

    def should_stop() -> bool:
        nonlocal rounds
        rounds += 1
        store.commit(lease, {})
        return rounds > 3

    return should_stop


def assert_taken_over_before_the_lease_timeout(store: Store, connector: str, last_heartbeat: datetime | None) -> None:
    """The new owner claimed the task before the old one's lease could have timed out: the standby noticed its
    lock transaction end, not a silence. By the database's clock, so that a slow machine does not decide it; how fast a
    takeover is belongs to the benchmarks (benchmarks/README.md, "Orchestration latency" and "Discovery and
    takeover at scale")."""
    lease = store.lease_of(connector, 0)
    assert lease is not None and lease.claimed_at is not None and last_heartbeat is not None
    assert lease.claimed_at - last_heartbeat < LEASE_TIMEOUT, f"taken over {lease.claimed_at - last_heartbeat} after"


def replica_of(stack: StackEndpoints, topic: str, written: int) -> ReplicaReport:
    return check_replica(
        stack.source_bootstrap_servers,
        topic,
        stack.destination_bootstrap_servers,
        partitions=PARTITIONS,
        written=written,
    )


@pytest.mark.parametrize("poll_s", [None, 0.2], ids=["blocking", "watched"])
def test_a_standby_waits_while_the_owner_lives_and_takes_over_when_its_lock_transaction_ends(
    store: Store, stack: StackEndpoints, unique: str, poll_s: float | None
) -> None:
    create_connector(store, connector_properties(stack, unique, **{"topics.whitelist": unique}), {0: [(unique, 0)]})
    owner = TaskOwnership(store.engine, unique, 0, "owner", LEASE_TIMEOUT)
    lease = owner.acquire()
    assert lease is not None and lease.epoch == 1
    held = store.engine.pool.checkedout()  # the owner's lock connection
    watch = LockWatch(store.engine, poll_s) if poll_s else None
    standby = TaskOwnership(store.engine, unique, 0, "standby", LEASE_TIMEOUT, lock_watch=watch)
    assert standby.acquire(three_waits_of_a_heartbeating_owner(store, lease)) is None
    assert epoch_of(store, unique) == 1
    # A watched standby (a worker's) holds no connection while it waits; a blocking one keeps its own.
    # (The watch itself holds one for a moment five times a second while anyone waits: awaited, not sampled.)
    expected = held + (0 if poll_s else 1)
    wait_until(lambda: store.engine.pool.checkedout() == expected, timeout=5, what=f"{expected} connections in use")
    store.commit(lease, {(unique, 0): 5})  # the owner still writes: nobody fenced it

    last_heartbeat = store.lease_of(unique, 0).heartbeat_at
    claimed: list[object] = []
    waiting = threading.Thread(target=lambda: claimed.append(standby.acquire()))
    waiting.start()
    owner.close()  # its lock transaction ends, as when its process is killed
    waiting.join(60)
    assert claimed and getattr(claimed[0], "epoch", None) == 2
    assert_taken_over_before_the_lease_timeout(store, unique, last_heartbeat)
    with pytest.raises(FencedError):
        store.commit(lease, {(unique, 0): 6})
    assert store.load_offsets(unique) == {(unique, 0): 5}
    standby.close()
    if watch:
        watch.close()


def test_the_owners_lock_outlives_the_servers_idle_and_transaction_timeouts(
    store: Store, stack: StackEndpoints, unique: str
) -> None:
    # A deployment may end idle transactions (or any long one, Postgres 17+) for its other clients; the owner's lock
    # transaction is idle for the task's whole life and must stay open, or a standby takes over a live owner.
    timeouts = "-c idle_in_transaction_session_timeout=300 -c transaction_timeout=300"
    strict = create_engine(store.engine.url, connect_args={"options": timeouts})
    create_connector(store, connector_properties(stack, unique, **{"topics.whitelist": unique}), {0: [(unique, 0)]})
    try:
        with TaskOwnership(strict, unique, 0, "owner", LEASE_TIMEOUT) as owner:
            lease = owner.acquire()
            assert lease is not None
            with TaskOwnership(store.engine, unique, 0, "standby", LEASE_TIMEOUT) as standby:
                assert standby.acquire(three_waits_of_a_heartbeating_owner(store, lease)) is None
            store.commit(lease, {(unique, 0): 1})
    finally:
        strict.dispose()
    assert epoch_of(store, unique) == 1


def test_a_silent_owner_is_fenced_when_its_lease_times_out(store: Store, stack: StackEndpoints, unique: str) -> None:
    create_connector(store, connector_properties(stack, unique, **{"topics.whitelist": unique}), {0: [(unique, 0)]})
    with TaskOwnership(store.engine, unique, 0, "owner", LEASE_TIMEOUT) as owner:
        lease = owner.acquire()
        assert lease is not None
        with store.engine.begin() as conn:  # alive (its lock transaction holds the lock) but silent for a minute
            conn.execute(
                text("UPDATE task_leases SET heartbeat_at = now() - interval '60 seconds' WHERE connector = :c"),
                {"c": unique},
            )
        with TaskOwnership(store.engine, unique, 0, "standby", LEASE_TIMEOUT) as standby:
            taken = standby.acquire()
            assert taken is not None and taken.epoch == lease.epoch + 1
            with pytest.raises(FencedError):
                store.commit(lease, {(unique, 0): 1})
        assert store.load_offsets(unique) == {}


def test_kill_9_of_the_owner_hands_over_to_the_standby_without_loss_or_reordering(
    store: Store, stack: StackEndpoints, unique: str, tmp_path: Path
) -> None:
    kill_9_hands_over(store, stack, stack.database_url, unique, tmp_path)


def kill_9_hands_over(store: Store, stack: StackEndpoints, database_url: str, unique: str, tmp_path: Path) -> None:
    """Owner and standby processes of a task, on `database_url`: the standby writes nothing while the owner lives,
    takes over when it is killed, fences it, and nothing is lost or reordered."""
    create_topics(stack.source_bootstrap_servers, {unique: PARTITIONS})
    create_topics(stack.destination_bootstrap_servers, {unique: PARTITIONS})
    create_connector(
        store,
        connector_properties(stack, unique, **{"topics.whitelist": unique}),
        {0: [(unique, p) for p in range(PARTITIONS)]},
    )
    traffic = Traffic(stack.source_bootstrap_servers, {unique: PARTITIONS}, rate=1000)
    tasks = dataclasses.replace(stack, database_url=database_url)
    owner = ReplicatorProcess.task(tasks, unique, tmp_path / "owner.log")
    standby: ReplicatorProcess | None = None
    try:
        wait_until(lambda: store.load_offsets(unique), timeout=60, what="the owner committing")
        epoch = epoch_of(store, unique)
        # Its lock transaction stays open (through PgBouncer: pinning a server connection) and holds back no vacuum.
        assert lock_holders(store, unique, epoch) == [("idle in transaction", None, None)]
        standby = ReplicatorProcess.task(tasks, unique, tmp_path / "standby.log")
        wait_until(lambda: "standing by" in standby.output(), timeout=60, what="the standby standing by")
        # While the owner lives, the standby writes nothing: no new epoch, every offset is the owner's.
        committed = dict(store.load_offsets(unique))
        wait_until(lambda: store.load_offsets(unique) != committed, what="the owner committing more")
        assert epoch_of(store, unique) == epoch and offset_epochs(store, unique) == {epoch}

        last_heartbeat = store.lease_of(unique, 0).heartbeat_at  # a later last beat only makes the check stricter
        owner.send(signal.SIGKILL)  # (PgBouncer closes the server connection its client left in a transaction)
        owner.process.wait(10)
        committed_at_kill = store.load_offsets(unique)
        wait_until(lambda: epoch_of(store, unique) == epoch + 1, timeout=60, what="the takeover")
        assert_taken_over_before_the_lease_timeout(store, unique, last_heartbeat)
        with pytest.raises(FencedError):
            store.commit(Lease(unique, 0, epoch), {(unique, 0): 0})
        written = traffic.stop()
        wait_until(lambda: sum(store.load_offsets(unique).values()) == written, timeout=60, what="everything copied")
        assert offset_epochs(store, unique) == {epoch + 1}
        assert "took over" in standby.output()
    finally:
        traffic.stop()
        owner.stop()
        if standby is not None:
            standby.stop()

    replica = replica_of(stack, unique, written)
    replica.assert_at_least_once()
    # Copied twice: only records after the owner's last commit (the new owner resumed from it).
    replica.assert_duplicates_only_after({p: o for (_, p), o in committed_at_kill.items()})


def lock_holders(store: Store, connector: str, epoch: int) -> list[tuple[str, object, object]]:
    """State, transaction id and snapshot horizon of the sessions holding `epoch`'s lock."""
    key = epoch_lock_key(connector, 0, epoch)
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT a.state, a.backend_xid, a.backend_xmin FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
                " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
                " AND l.classid::bigint = :high AND l.objid::bigint = :low"
            ),
            {"high": (key >> 32) & 0xFFFFFFFF, "low": key & 0xFFFFFFFF},
        )
        return [tuple(row) for row in rows]


def test_a_stopped_owner_is_fenced_after_the_lease_timeout_and_never_commits_again(
    store: Store, stack: StackEndpoints, unique: str, tmp_path: Path
) -> None:
    create_topics(stack.source_bootstrap_servers, {unique: PARTITIONS})
    create_topics(stack.destination_bootstrap_servers, {unique: PARTITIONS})
    properties = connector_properties(
        stack,
        unique,
        **{
            "topics.whitelist": unique,
            "task.heartbeat.interval.ms": "500",
            "task.lease.timeout.ms": "3000",
        },
    )
    create_connector(store, properties, {0: [(unique, p) for p in range(PARTITIONS)]})
    traffic = Traffic(stack.source_bootstrap_servers, {unique: PARTITIONS}, rate=1000)
    owner = ReplicatorProcess.task(stack, unique, tmp_path / "owner.log")
    standby: ReplicatorProcess | None = None
    try:
        wait_until(lambda: store.load_offsets(unique), timeout=60, what="the owner committing")
        epoch = epoch_of(store, unique)
        standby = ReplicatorProcess.task(stack, unique, tmp_path / "standby.log")
        wait_until(lambda: "standing by" in standby.output(), timeout=60, what="the standby standing by")

        owner.send(signal.SIGSTOP)  # alive, connected, silent
        time.sleep(0.3)  # a commit already sent when it stopped may still land; the row then shows it
        last_heartbeat = store.lease_of(unique, 0).heartbeat_at
        wait_until(lambda: epoch_of(store, unique) == epoch + 1, timeout=60, what="the takeover")
        lease = store.lease_of(unique, 0)
        assert lease is not None and lease.claimed_at is not None and last_heartbeat is not None
        assert (lease.claimed_at - last_heartbeat).total_seconds() > 3.0, "taken over before the lease timed out"
        owner.send(signal.SIGCONT)
        owner.process.wait(30)  # it wakes up, tries to commit, learns it was fenced and stops
        assert "task ended: FENCED" in owner.output()
        written = traffic.stop()
        wait_until(lambda: sum(store.load_offsets(unique).values()) == written, timeout=60, what="everything copied")
        assert offset_epochs(store, unique) == {epoch + 1}
    finally:
        traffic.stop()
        owner.send(signal.SIGCONT)
        owner.stop()
        if standby is not None:
            standby.stop()
    # Nothing lost or reordered; the woken owner may have sent its last batch after the new owner's first copies.
    replica_of(stack, unique, written).assert_at_least_once(fenced_writer=True)


def test_a_standby_blocked_on_the_lease_row_still_stops_when_asked(
    store: Store, stack: StackEndpoints, unique: str
) -> None:
    # An owner frozen in the middle of a commit (SIGSTOP, a hung host) keeps the lease row locked: the standby must
    # still notice termination instead of waiting on the row until the owner moves again.
    create_connector(store, connector_properties(stack, unique, **{"topics.whitelist": unique}), {0: [(unique, 0)]})
    with TaskOwnership(store.engine, unique, 0, "owner", LEASE_TIMEOUT) as owner:
        assert owner.acquire() is not None
        stop = threading.Event()
        result: list[object] = []
        with TaskOwnership(store.engine, unique, 0, "standby", LEASE_TIMEOUT) as standby:
            waiting = threading.Thread(target=lambda: result.append(standby.acquire(stop.is_set)))
            with store.engine.connect() as frozen:
                with frozen.begin():
                    frozen.execute(text("SELECT 1 FROM task_leases WHERE connector = :c FOR UPDATE"), {"c": unique})
                    waiting.start()
                    wait_until(lambda: _waits_on_a_lock(store), what="the standby blocked on the lease row")
                    stop.set()
                    waiting.join(60)
                    stuck = waiting.is_alive()
                waiting.join(60)  # (the row is free again: a standby that was stuck on it goes on now)
            assert not stuck, "the standby kept waiting on the lease row after it was asked to stop"
        assert result == [None]
        assert epoch_of(store, unique) == 1


def _waits_on_a_lock(store: Store) -> bool:
    with store.engine.connect() as conn:
        return bool(
            conn.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND query LIKE '%task_leases%FOR UPDATE%'"
                )
            )
        )
