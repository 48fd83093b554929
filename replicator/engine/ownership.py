"""Who runs a task: one owner, and warm standbys that take over the moment the owner's process dies.

Every instance of a task (a run) first calls `TaskOwnership.acquire`. The lease row (`task_leases`) says which epoch
owns the task; the owner also holds its epoch's lock, a Postgres advisory lock held by a transaction it keeps open
on a connection of its own for its whole life (its *lock transaction*: `replicator.state.epoch_locks`, which says
how that works through PgBouncer and holds back no vacuum).

Claiming epoch E+1 takes E+1's lock in a new lock transaction first, then raises the epoch from E (conditionally:
only if it is still E) in a separate transaction that commits; if that raise does not commit, the lock transaction
is rolled back. So whoever reads epoch E also sees E's lock held — until the owner's lock transaction ends. A process
killed with SIGKILL loses its sockets at once, and with them its lock transaction: the lock is released within
milliseconds; a standby blocked on that lock wakes up and claims the task with the next epoch. That is what makes a
takeover take well under a second instead of a lease timeout plus a new process.

A standby takes over only when one of these holds, checked under the lease row's lock:
- nobody holds the lease (never claimed, or its last owner ended: STOPPED, FAILED, PAUSED, ...);
- the owner's epoch lock is free (its lock transaction is gone: crash, kill -9, lost connection);
- the owner is alive but silent: no heartbeat for `stale_after` (`task.lease.timeout.ms`), e.g. stopped or hung.
So a standby never claims while the owner holds a live, heartbeating lease. Whatever the reason, the claim raises
the epoch, and every write of the older owner (offsets, heartbeats, partition claims: `replicator/state/store.py`) is
conditional on its own epoch and fails from then on — a slow owner that wakes up learns it was fenced at its next
commit and stops.

A task process therefore holds one connection for its work (the claim transactions and, once it owns the task, its
commits) and one for its lock transactions: while it owns the task that one keeps a server connection for good, and
while it stands by it is inside a wait of up to WAIT_S nearly all the time. A worker's standbys
(`replicator.engine.worker`) wait together instead (`LockWatch`): one statement asks which of their owners' locks are
free, five times a second, and none of them holds a connection meanwhile; a takeover is up to that much later.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from replicator.configuration.connector import load
from replicator.engine.task import ReplicationTask, TaskExit
from replicator.state.epoch_locks import EpochLocks, epoch_lock_key, free_locks, lock_timed_out
from replicator.state.ownership_store import LeaseClaim
from replicator.state.records import Lease, UnknownConnectorError
from replicator.state.store import Store

WAIT_S = 1.0  # longest single wait on a lock: termination and staleness are checked in between


class TaskOwnership:
    """A task's claim held on its own Postgres connection: the owner's lock lives exactly as long as it does."""

    def __init__(
        self,
        engine: Engine,
        connector: str,
        task_id: int,
        owner: str,
        stale_after: timedelta,
        on_event: Callable[[str], None] = lambda message: None,
        lock_watch: LockWatch | None = None,
    ) -> None:
        self.connector, self.task_id, self.owner, self.stale_after = connector, task_id, owner, stale_after
        self.on_event = on_event
        self.store = Store(engine)
        self.locks = EpochLocks(engine, connector, task_id, WAIT_S)  # connected at the first lock transaction
        # None: a standby blocks on the owner's lock, on a connection of its own (a takeover within milliseconds).
        # A watch: it waits for the watch to see the lock free, holding no connection (nor, through PgBouncer, a
        # server connection) meanwhile: a worker's many standbys.
        self.lock_watch = lock_watch
        self.lease: Lease | None = None
        self.waited_s = 0.0  # how long `acquire` stood by (0: the task was free)

    def acquire(self, should_stop: Callable[[], bool] = lambda: False) -> Lease | None:
        """Stand by until the task is free, then claim it with a new epoch; None if stopped while waiting.

        Raises UnknownConnectorError if the connector does not exist when first asked; returns None if it is
        deleted while standing by.
        """
        started = time.monotonic()
        first = True
        waiting_for: int | None = None
        while not should_stop():
            try:
                # A transaction of the owner that holds the lease row (a process frozen mid-commit) must not hold the
                # standby past termination: give up the row after WAIT_S and check again.
                with self.store.claiming(self.connector, self.task_id, WAIT_S) as claim:
                    if not claim.connector_exists():
                        if first:
                            raise UnknownConnectorError(f"connector {self.connector!r} does not exist")
                        return None
                    first = False
                    holder = self._try_claim(claim)
            except BaseException as exc:
                self.locks.release()  # the epoch's lock, if taken, for a raise that did not commit
                if not lock_timed_out(exc):
                    raise
                continue
            if isinstance(holder, Lease):
                self.lease = holder
                self.waited_s = time.monotonic() - started if waiting_for is not None else 0.0
                return holder
            if holder is None:
                continue
            if holder != waiting_for:
                waiting_for = holder
                self.on_event(f"standing by: epoch {holder} owns the task")
            self._wait_for(holder)
        return None

    def close(self) -> None:
        """End the lock transaction, so a standby takes over at once, and give the connection back."""
        self.locks.close()

    def __enter__(self) -> TaskOwnership:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _try_claim(self, claim: LeaseClaim) -> Lease | int | None:
        """Claim the task if it is free (committed when `claim` is); otherwise the epoch whose owner holds it, or
        None when another instance claimed it first meanwhile."""
        current, heartbeating = claim.current(self.stale_after)
        # The owner's lock is free only if its lock transaction is gone; taken here, it is given back when `claim` ends.
        if heartbeating and not claim.lock_free(current):
            return current  # the owner's lock transaction is open and it heartbeats: stand by
        # Held before the new epoch commits: whoever reads the epoch finds its lock held.
        self.locks.hold(current + 1)
        lease = claim.raise_epoch(self.owner, current)
        if lease is None:  # no row was there when read, and another instance inserted the first epoch since
            self.locks.release()
        return lease

    def _wait_for(self, epoch: int) -> None:
        """Wait up to WAIT_S for `epoch`'s lock to be free: with a watch, until it sees it free; else blocked on it
        (granted the moment the owner's lock transaction ends: the next check claims the task)."""
        if self.lock_watch is not None:
            self.lock_watch.wait(epoch_lock_key(self.connector, self.task_id, epoch), WAIT_S)
        else:
            self.locks.wait(epoch)


class LockWatch:
    """Standbys waiting together: which of their owners' epoch locks are free is asked for all of them in one
    statement every `poll_s`, on a pooled connection held for that statement only.

    A worker's standbys then hold no connection while they wait and cost one statement per poll between them,
    however many they are; a takeover comes up to `poll_s` later than a blocking standby's."""

    def __init__(self, engine: Engine, poll_s: float) -> None:
        self.engine, self.poll_s = engine, poll_s
        self._waiting: dict[int, list[threading.Event]] = {}
        self._guard = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="mirus-lock-watch")
        self._thread.start()

    def wait(self, key: int, timeout_s: float) -> None:
        """Return once `key`'s lock was seen free, or after `timeout_s`."""
        seen = threading.Event()
        with self._guard:
            self._waiting.setdefault(key, []).append(seen)
        try:
            seen.wait(timeout_s)
        finally:
            with self._guard:
                waiting = self._waiting.get(key, [])
                waiting.remove(seen)
                if not waiting:
                    del self._waiting[key]

    def close(self) -> None:
        self._closed.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._closed.wait(self.poll_s):
            with self._guard:
                keys = list(self._waiting)
            if not keys:
                continue
            try:
                free = free_locks(self.engine, keys)
            except SQLAlchemyError:
                continue  # the database is unreachable: each standby's own check says so
            with self._guard:
                for key in free:
                    for seen in self._waiting.get(key, ()):
                        seen.set()


@contextlib.contextmanager
def frozen_start() -> Iterator[None]:
    """The objects made before the copy starts (modules, classes, settings, clients) out of the collector's sight
    while the task runs: they live as long as it does, yet each full collection walked all of them again while
    records streamed. Back in sight when it ends: a garbage cycle that holds one of them (the task itself, or a client
    it made) would otherwise never be collected, and its clients would go on connecting for the rest of the process."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def run_owned(
    task: ReplicationTask, should_stop: Callable[[], bool] = lambda: False, lock_watch: LockWatch | None = None
) -> TaskExit | None:
    """Stand by until `task` is free, then run it, holding the epoch lock until it has ended.

    None if stopped (or the connector deleted) while standing by. Raises what `ReplicationTask.run` raises.
    `lock_watch`: see `TaskOwnership`.
    """
    task.should_stop = should_stop
    record = task.store.get_connector(task.connector)
    stale_after = timedelta(milliseconds=load(record.properties).task_lease_timeout_ms)
    with TaskOwnership(
        task.store.engine, task.connector, task.task_id, task.owner, stale_after, task.on_event, lock_watch
    ) as ownership:
        task.prepare()  # connected while standing by
        lease = None
        try:
            lease = ownership.acquire(should_stop)
        finally:
            if lease is None:  # stopped, terminated or deleted while standing by: the run's last event says so
                task.discard()
                task.on_event("stopped: standing by, the task was never taken over")
        if lease is None:
            return None
        with frozen_start():
            return task.run(should_stop, lease, ownership.waited_s)
