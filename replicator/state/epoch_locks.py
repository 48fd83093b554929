"""Epoch locks: the Postgres advisory lock named after a task's epoch, which its owner holds for as long as it lives
(`replicator.engine.ownership` says who claims when).

The lock is transaction-scoped, held by a transaction the owner opens on a connection of its own and keeps open for
its whole life (the *lock transaction*), so that it works through a transaction pooler (PgBouncer's `pool_mode =
transaction` pins a server connection to a client while its transaction is open; a session lock would stay on
whichever server connection ran the statement). The lock transaction never writes (no transaction id) and runs READ
COMMITTED (no snapshot held between statements), so it holds back no vacuum however long it stays open.

A process killed with SIGKILL loses its sockets at once: Postgres ends its session (through PgBouncer: PgBouncer
closes the server connection its client left inside a transaction) and the lock is released within milliseconds;
a transaction blocked on that lock is granted it then.

Waiting on many locks at once (`free_locks`) costs one statement on a pooled connection held for that statement
only: the locks it gets end with its transaction.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection

from sqlalchemy import Connection, Engine, RootTransaction, text
from sqlalchemy.exc import DBAPIError, OperationalError


def epoch_lock_key(connector: str, task_id: int, epoch: int) -> int:
    """The advisory lock key (a signed 64-bit integer) owned by `epoch` of the task."""
    digest = hashlib.blake2b(f"{connector}\0{task_id}\0{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def limit_lock_waits(conn: Connection, wait_s: float) -> None:
    """In `conn`'s transaction, a wait on any lock longer than `wait_s` fails (see `lock_timed_out`)."""
    conn.execute(text(f"SET LOCAL lock_timeout = '{int(wait_s * 1000)}ms'"))


def lock_timed_out(exc: BaseException) -> bool:
    """Whether `exc` ended a wait on a lock that `limit_lock_waits` limited."""
    return isinstance(exc, OperationalError) and getattr(exc.orig, "pgcode", None) == "55P03"


def free_locks(engine: Engine, keys: Collection[int]) -> set[int]:
    """Those of `keys` whose lock is free now, asked in one statement."""
    with engine.connect() as conn:  # the locks it gets end with this transaction
        query = text("SELECT k FROM unnest(CAST(:keys AS bigint[])) AS k WHERE pg_try_advisory_xact_lock(k)")
        return set(conn.scalars(query, {"keys": list(keys)}))


class EpochLocks:
    """A task's epoch locks as one instance of it takes them: in lock transactions on a connection of its own,
    opened at the first, each waiting up to `wait_s` for its lock."""

    def __init__(self, engine: Engine, connector: str, task_id: int, wait_s: float) -> None:
        self.engine, self.connector, self.task_id, self.wait_s = engine, connector, task_id, wait_s
        self._conn: Connection | None = None
        self._held: RootTransaction | None = None  # the lock transaction holding our epoch's lock

    def hold(self, epoch: int) -> None:
        """Hold `epoch`'s lock until `release` (or `close`); past `wait_s` without it, an error (`lock_timed_out`)."""
        self._held = self._lock(epoch)

    def release(self) -> None:
        """End the lock transaction holding our epoch's lock, if there is one."""
        if self._held is not None:
            held, self._held = self._held, None
            held.rollback()

    def wait(self, epoch: int) -> None:
        """Block on `epoch`'s lock for up to `wait_s`: it is granted the moment its holder's lock transaction ends."""
        try:
            self._lock(epoch).rollback()  # granted: its holder is gone
        except OperationalError as exc:
            if not lock_timed_out(exc):
                raise
            # its holder is still there

    def close(self) -> None:
        """End the lock transaction, so that the lock is free at once, and give the connection back."""
        if self._conn is None:
            return
        try:
            self.release()
        except DBAPIError:
            self._conn.invalidate()  # broken (Postgres or the pooler gone): the lock ends with its server session
        self._conn.close()

    @property
    def _connection(self) -> Connection:
        if self._conn is None:
            self._conn = self.engine.connect()
        return self._conn

    def _lock(self, epoch: int) -> RootTransaction:
        """A lock transaction holding `epoch`'s lock."""
        conn = self._connection
        transaction = conn.begin()
        try:
            # No snapshot between statements and no transaction id (it never writes): open for the owner's whole
            # life, it holds back no vacuum, whatever the server's default isolation.
            conn.execute(text("SET TRANSACTION ISOLATION LEVEL READ COMMITTED"))
            limit_lock_waits(conn, self.wait_s)
            # Idle by design: a server's idle_in_transaction_session_timeout (or transaction_timeout, Postgres 17+)
            # would end it and hand the task of a live owner to a standby. Off in this transaction, for those of
            # the two this server knows.
            conn.execute(
                text(
                    "SELECT set_config(name, '0', true) FROM pg_settings"
                    " WHERE name IN ('idle_in_transaction_session_timeout', 'transaction_timeout')"
                )
            )
            conn.execute(
                text("SELECT pg_advisory_xact_lock(:k)"), {"k": epoch_lock_key(self.connector, self.task_id, epoch)}
            )
        except BaseException:
            transaction.rollback()
            raise
        return transaction
