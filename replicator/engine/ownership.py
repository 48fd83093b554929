"""Who runs a task: one owner, and warm standbys that take over the moment the owner's process dies.

Every instance of a task (a run) first calls `TaskOwnership.acquire`. The lease row (`task_leases`) says which epoch
owns the task; the owner also holds a Postgres advisory lock named after its epoch. The lock is transaction-scoped,
held by a transaction the owner opens on a connection of its own and keeps open for its whole life (the *lock
transaction*), so that it works through a transaction pooler (PgBouncer's `pool_mode = transaction` pins a server
connection to a client while its transaction is open; a session lock would stay on whichever server connection ran
the statement). The lock transaction never writes (no transaction id) and runs READ COMMITTED (no snapshot held
between statements), so it holds back no vacuum however long it stays open.

Claiming epoch E+1 takes E+1's lock in a new lock transaction first, then raises the epoch from E (conditionally:
only if it is still E) in a separate transaction that commits; if that raise does not commit, the lock transaction
is rolled back. So whoever reads epoch E also sees E's lock held — until the owner's lock transaction ends. A process
killed with SIGKILL loses its sockets at once: Postgres ends its session (through PgBouncer: PgBouncer closes the
server connection its client left inside a transaction) and the lock is released within milliseconds; a standby
blocked on that lock wakes up and claims the task with the next epoch. That is what makes a takeover take well under
a second instead of a lease timeout plus a new process.

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

import hashlib
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import Connection, Engine, RootTransaction, text
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError

from replicator.configuration.connector import load
from replicator.engine.task import ReplicationTask, TaskExit
from replicator.state.records import LEASE_HELD, Lease, UnknownConnectorError

WAIT_S = 1.0  # longest single wait on a lock: termination and staleness are checked in between
LOCK_TIMEOUT = f"SET LOCAL lock_timeout = '{int(WAIT_S * 1000)}ms'"


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
        lock_watch: LockWatch | None = None,
    ) -> None:
        self.connector, self.task_id, self.owner, self.stale_after = connector, task_id, owner, stale_after
        self.on_event = on_event
        self.engine = engine
        # None: a standby blocks on the owner's lock, on a connection of its own (a takeover within milliseconds).
        # A watch: it waits for the watch to see the lock free, holding no connection (nor, through PgBouncer, a
        # server connection) meanwhile: a worker's many standbys.
        self.lock_watch = lock_watch
        self._conn: Connection | None = None  # for lock transactions only; opened at the first one
        self.held: RootTransaction | None = None  # the lock transaction holding our epoch's lock
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
                with self.engine.begin() as conn:
                    # A transaction of the owner that holds the lease row (a process frozen mid-commit) must not
                    # hold the standby past termination: give up the row after WAIT_S and check again.
                    conn.execute(text(LOCK_TIMEOUT))
                    if self._connector_missing(conn):
                        if first:
                            raise UnknownConnectorError(f"connector {self.connector!r} does not exist")
                        return None
                    first = False
                    holder = self._try_claim(conn)
            except BaseException as exc:
                self._release()  # the epoch's lock, if taken, for a raise that did not commit
                if not (isinstance(exc, OperationalError) and _lock_not_available(exc)):
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
        if self._conn is None:
            return
        try:
            self._release()
        except DBAPIError:
            self._conn.invalidate()  # broken (Postgres or the pooler gone): the lock ends with its server session
        self._conn.close()

    def __enter__(self) -> TaskOwnership:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside one transaction, under the lease row's lock ---------------------------------------------

    def _connector_missing(self, conn: Connection) -> bool:
        found = conn.execute(text("SELECT 1 FROM connectors WHERE name = :c FOR SHARE"), {"c": self.connector}).first()
        return found is None

    def _try_claim(self, conn: Connection) -> Lease | int | None:
        """Claim the task if it is free (committed when `conn`'s transaction is); otherwise the epoch whose owner
        holds it, or None when another instance claimed it first meanwhile."""
        ids = {"c": self.connector, "t": self.task_id}
        row = conn.execute(
            text(
                "SELECT epoch, state, heartbeat_at < now() - :stale AS silent FROM task_leases"
                " WHERE connector = :c AND task_id = :t FOR UPDATE"
            ),
            {**ids, "stale": self.stale_after},
        ).first()
        current = int(row.epoch) if row is not None else 0
        heartbeating = row is not None and row.state == LEASE_HELD and not row.silent
        # The owner's lock is free only if its lock transaction is gone; taken here, it is given back when `conn` ends.
        if heartbeating and not conn.scalar(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": self._key(current)}):
            return current  # the owner's lock transaction is open and it heartbeats: stand by
        # Held before the new epoch commits: whoever reads the epoch finds its lock held.
        self.held = self._lock(current + 1)
        raised = conn.execute(
            text(
                "INSERT INTO task_leases (connector, task_id, epoch, owner, state, error, claimed_at, heartbeat_at)"
                " VALUES (:c, :t, 1, :owner, :held, NULL, now(), now())"
                " ON CONFLICT (connector, task_id) DO UPDATE SET epoch = task_leases.epoch + 1, owner = :owner,"
                " state = :held, error = NULL, claimed_at = now(), heartbeat_at = now()"
                " WHERE task_leases.epoch = :current RETURNING epoch"
            ),
            {**ids, "owner": self.owner, "held": LEASE_HELD, "current": current},
        ).first()
        if raised is None:  # no row was there when read, and another instance inserted the first epoch since
            self._release()
            return None
        return Lease(self.connector, self.task_id, current + 1)

    # -- lock transactions, on `self.conn` ------------------------------------------------------------------

    @property
    def conn(self) -> Connection:
        if self._conn is None:
            self._conn = self.engine.connect()
        return self._conn

    def _key(self, epoch: int) -> int:
        return epoch_lock_key(self.connector, self.task_id, epoch)

    def _lock(self, epoch: int) -> RootTransaction:
        """A lock transaction holding `epoch`'s lock, waited for up to WAIT_S (OperationalError 55P03 past that)."""
        transaction = self.conn.begin()
        try:
            # No snapshot between statements and no transaction id (it never writes): open for the owner's whole
            # life, it holds back no vacuum, whatever the server's default isolation.
            self.conn.execute(text("SET TRANSACTION ISOLATION LEVEL READ COMMITTED"))
            self.conn.execute(text(LOCK_TIMEOUT))
            # Idle by design: a server's idle_in_transaction_session_timeout (or transaction_timeout, Postgres 17+)
            # would end it and hand the task of a live owner to a standby. Off in this transaction, for those of
            # the two this server knows.
            self.conn.execute(
                text(
                    "SELECT set_config(name, '0', true) FROM pg_settings"
                    " WHERE name IN ('idle_in_transaction_session_timeout', 'transaction_timeout')"
                )
            )
            self.conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": self._key(epoch)})
        except BaseException:
            transaction.rollback()
            raise
        return transaction

    def _release(self) -> None:
        if self.held is not None:
            held, self.held = self.held, None
            held.rollback()

    def _wait_for(self, epoch: int) -> None:
        """Block on `epoch`'s lock for up to WAIT_S: it is granted the moment the owner's lock transaction ends (or,
        with a watch, until it sees the lock free)."""
        if self.lock_watch is not None:
            self.lock_watch.wait(self._key(epoch), WAIT_S)
            return
        try:
            self._lock(epoch).rollback()  # granted: the owner is gone; the next check claims the task
        except OperationalError as exc:
            if not _lock_not_available(exc):
                raise
            # the owner is still there


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
                with self.engine.connect() as conn:  # the locks it gets end with this transaction
                    free = set(conn.scalars(text(FREE_LOCKS), {"keys": keys}))
            except SQLAlchemyError:
                continue  # the database is unreachable: each standby's own check says so
            with self._guard:
                for key in free:
                    for seen in self._waiting.get(key, ()):
                        seen.set()


FREE_LOCKS = "SELECT k FROM unnest(CAST(:keys AS bigint[])) AS k WHERE pg_try_advisory_xact_lock(k)"


def _lock_not_available(exc: OperationalError) -> bool:
    return getattr(exc.orig, "pgcode", None) == "55P03"  # lock_timeout expired


def run_owned(
    task: ReplicationTask, should_stop: Callable[[], bool] = lambda: False, lock_watch: LockWatch | None = None
) -> TaskExit | None:
    """Stand by until `task` is free, then run it, holding the epoch lock until it has ended.

    None if stopped (or the connector deleted) while standing by. Raises what `ReplicationTask.run` raises.
    `lock_watch`: see `TaskOwnership`.
    """
    task.should_stop = should_stop
    record = task.store.get_connector(task.connector)
    stale_after = timedelta(milliseconds=load(record.properties).lease_timeout_ms)
    with TaskOwnership(
        task.store.engine, task.connector, task.task_id, task.owner, stale_after, task.on_event, lock_watch
    ) as held:
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
        return task.run(should_stop, lease, held.waited_s)
