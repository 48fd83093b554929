"""Who runs a task: one owner, and warm standbys that take over the moment the owner's process dies.

Every instance of a task (a run) first calls `TaskOwnership.acquire`. The lease row (`task_leases`) says which epoch
owns the task; the owner also holds a Postgres *session* advisory lock named after its epoch, on a connection it
keeps for its whole life. The lock is taken in the transaction that raises the epoch, so whoever reads epoch E
also sees E's lock held — until the owner's session ends. A process killed with SIGKILL loses its sockets at once,
so Postgres ends its session and releases the lock within milliseconds; a standby blocked on that lock wakes up and
claims the task with the next epoch. That is what makes a takeover take well under a second instead of a lease
timeout plus a new process.

A standby takes over only when one of these holds, checked under the lease row's lock:
- nobody holds the lease (never claimed, or its last owner ended: STOPPED, FAILED, PAUSED, ...);
- the owner's epoch lock is free (its session is gone: crash, kill -9, lost connection);
- the owner is alive but silent: no heartbeat for `stale_after` (`task.lease.timeout.ms`), e.g. stopped or hung.
So a standby never claims while the owner holds a live, heartbeating lease. Whatever the reason, the claim raises
the epoch, and every write of the older owner (offsets, heartbeats, partition claims: `replicator/store.py`) is
conditional on its own epoch and fails from then on — a slow owner that wakes up learns it was fenced at its next
commit and stops.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import OperationalError

from replicator.config import load
from replicator.store import LEASE_HELD, Lease, UnknownConnectorError
from replicator.task import ReplicationTask, TaskExit

WAIT_S = 1.0  # longest single wait on the owner's lock: termination and staleness are checked in between


def epoch_lock_key(connector: str, task_id: int, epoch: int) -> int:
    """The advisory lock key (a signed 64-bit integer) owned by `epoch` of the task."""
    digest = hashlib.blake2b(f"{connector}\0{task_id}\0{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


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
    ) -> None:
        self.connector, self.task_id, self.owner, self.stale_after = connector, task_id, owner, stale_after
        self.on_event = on_event
        self.conn: Connection = engine.connect()
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
                with self.conn.begin():
                    # A transaction of the owner that holds the lease row (a process frozen mid-commit) must not
                    # hold the standby past termination: give up the row after WAIT_S and check again.
                    self.conn.execute(text(f"SET LOCAL lock_timeout = '{int(WAIT_S * 1000)}ms'"))
                    if self._connector_missing():
                        if first:
                            raise UnknownConnectorError(f"connector {self.connector!r} does not exist")
                        return None
                    first = False
                    holder = self._try_claim()
            except OperationalError as exc:
                if not _lock_not_available(exc):
                    raise
                continue
            if isinstance(holder, Lease):
                self.lease = holder
                self.waited_s = time.monotonic() - started if waiting_for is not None else 0.0
                return holder
            if holder != waiting_for:
                waiting_for = holder
                self.on_event(f"standing by: epoch {holder} owns the task")
            self._wait_for(holder)
        return None

    def close(self) -> None:
        """End the session (not back to the pool): the epoch lock is released, so a standby takes over at once."""
        self.conn.invalidate()
        self.conn.close()

    def __enter__(self) -> TaskOwnership:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside one transaction, under the lease row's lock ---------------------------------------------

    def _connector_missing(self) -> bool:
        found = self.conn.execute(
            text("SELECT 1 FROM connectors WHERE name = :c FOR SHARE"), {"c": self.connector}
        ).first()
        return found is None

    def _try_claim(self) -> Lease | int:
        """Claim the task if it is free; otherwise the epoch whose owner holds it."""
        ids = {"c": self.connector, "t": self.task_id}
        row = self.conn.execute(
            text("SELECT epoch, state, heartbeat_at < now() - :stale AS silent FROM task_leases"
                 " WHERE connector = :c AND task_id = :t FOR UPDATE"),
            {**ids, "stale": self.stale_after},
        ).first()  # fmt: skip
        if row is not None and row.state == LEASE_HELD and not row.silent:
            held = epoch_lock_key(self.connector, self.task_id, row.epoch)
            if not self.conn.scalar(text("SELECT pg_try_advisory_lock(:k)"), {"k": held}):
                return int(row.epoch)  # the owner's session is alive and it heartbeats: stand by
            self.conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": held})
        epoch = self.conn.scalar(
            text("INSERT INTO task_leases (connector, task_id, epoch, owner, state, error, claimed_at, heartbeat_at)"
                 " VALUES (:c, :t, 1, :owner, :held, NULL, now(), now())"
                 " ON CONFLICT (connector, task_id) DO UPDATE SET epoch = task_leases.epoch + 1, owner = :owner,"
                 " state = :held, error = NULL, claimed_at = now(), heartbeat_at = now() RETURNING epoch"),
            {**ids, "owner": self.owner, "held": LEASE_HELD},
        )  # fmt: skip
        # Taken before the new epoch commits: whoever reads the epoch finds its lock held.
        self.conn.execute(
            text("SELECT pg_advisory_lock(:k)"), {"k": epoch_lock_key(self.connector, self.task_id, epoch)}
        )
        return Lease(self.connector, self.task_id, int(epoch))

    def _wait_for(self, epoch: int) -> None:
        """Block on `epoch`'s lock for up to WAIT_S: it is granted the moment the owner's session ends."""
        key = epoch_lock_key(self.connector, self.task_id, epoch)
        try:
            with self.conn.begin():
                self.conn.execute(text(f"SET LOCAL lock_timeout = '{int(WAIT_S * 1000)}ms'"))
                self.conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
        except OperationalError as exc:
            if not _lock_not_available(exc):
                raise
            return  # the owner is still there
        # Session locks outlive the transaction: give it back; the next check claims the task.
        self.conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
        self.conn.commit()


def _lock_not_available(exc: OperationalError) -> bool:
    return getattr(exc.orig, "pgcode", None) == "55P03"  # lock_timeout expired


def run_owned(task: ReplicationTask, should_stop: Callable[[], bool] = lambda: False) -> TaskExit | None:
    """Stand by until `task` is free, then run it, holding the epoch lock until it has ended.

    None if stopped (or the connector deleted) while standing by. Raises what `ReplicationTask.run` raises.
    """
    record = task.store.get_connector(task.connector)
    stale_after = timedelta(milliseconds=load(record.properties).lease_timeout_ms)
    with TaskOwnership(task.store.engine, task.connector, task.task_id, task.owner, stale_after, task.on_event) as held:
        task.prepare()  # connected while standing by
        lease = None
        try:
            lease = held.acquire(should_stop)
        finally:
            if lease is None:  # stopped, terminated or deleted while standing by: the run's last event says so
                task.discard()
                task.on_event("stopped: standing by, the task was never taken over")
        if lease is None:
            return None
        if held.waited_s:
            task.on_event(f"took over after standing by {held.waited_s:.1f}s")
        return task.run(should_stop, lease)
