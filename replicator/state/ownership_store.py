"""Who owns what: task leases (claims with an epoch, heartbeats, how an instance ended) and each partition's owner
and state (the assignment generations are `assignment_store.py`'s).

A lease is claimed one way (`_claim`): its epoch raised, fencing every earlier instance. `claim_task` claims it
outright; a standby's takeover (`replicator.engine.ownership`) claims it in a `LeaseClaim`, which reads the lease
under its row's lock and raises the epoch only if it is still the one read, so that the new epoch's lock
(`replicator.state.epoch_locks`) can be taken before the raise commits.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta

from sqlalchemy import (
    ColumnElement,
    Connection,
    and_,
    delete,
    func,
    literal,
    or_,
    select,
    text,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import ReturningInsert

from replicator.assignment import SourcePartition
from replicator.state.base import StoreBase, partition_rows, status_rows_of, typed_row
from replicator.state.epoch_locks import epoch_lock_key, limit_lock_waits
from replicator.state.records import (
    LEASE_HELD,
    FencedError,
    Lease,
    LeaseRow,
    PartitionHealth,
    PartitionStatusRow,
    UnknownConnectorError,
)
from replicator.state.schema import (
    Connector,
    PartitionStatus,
    TaskLease,
)


def _claim(connector: str, task_id: int, owner: str, current: int | None = None) -> ReturningInsert[int]:
    """The lease claim: the task's next epoch for `owner` (the first if it has no lease row), returned; given
    `current`, only if the epoch is still that (else it returns no row)."""
    claim = insert(TaskLease).values(
        connector=connector,
        task_id=task_id,
        epoch=1,
        owner=owner,
        state=LEASE_HELD,
        claimed_at=func.now(),
        heartbeat_at=func.now(),
    )
    return claim.on_conflict_do_update(
        index_elements=[TaskLease.connector, TaskLease.task_id],
        set_={
            "epoch": TaskLease.epoch + 1,
            "owner": owner,
            "state": LEASE_HELD,
            "error": None,
            "claimed_at": func.now(),
            "heartbeat_at": func.now(),
        },
        where=None if current is None else TaskLease.epoch == current,
    ).returning(TaskLease.epoch)


class LeaseClaim:
    """A task's lease as a takeover reads and claims it, in one transaction (`OwnershipStore.claiming`): the rows it
    reads stay locked, and the locks it takes held, until that transaction ends."""

    def __init__(self, conn: Connection, connector: str, task_id: int) -> None:
        self.conn, self.connector, self.task_id = conn, connector, task_id

    def connector_exists(self) -> bool:
        """Whether the connector exists; it cannot be deleted before the claim ends."""
        found = self.conn.execute(
            text("SELECT 1 FROM connectors WHERE name = :c FOR SHARE"), {"c": self.connector}
        ).first()
        return found is not None

    def current(self, stale_after: timedelta) -> tuple[int, bool]:
        """The lease's epoch (0: never claimed) and whether its owner heartbeats: holds the lease and beat within
        `stale_after`. The lease row stays locked: no other claim and no commit of the owner comes between."""
        row = self.conn.execute(
            text(
                "SELECT epoch, state, heartbeat_at < now() - :stale AS silent FROM task_leases"
                " WHERE connector = :c AND task_id = :t FOR UPDATE"
            ),
            {"c": self.connector, "t": self.task_id, "stale": stale_after},
        ).first()
        if row is None:
            return 0, False
        return int(row.epoch), row.state == LEASE_HELD and not row.silent

    def lock_free(self, epoch: int) -> bool:
        """Whether `epoch`'s lock is free (no lock transaction holds it); if it is, the claim holds it until it
        ends."""
        key = epoch_lock_key(self.connector, self.task_id, epoch)
        return bool(self.conn.scalar(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": key}))

    def raise_epoch(self, owner: str, current: int) -> Lease | None:
        """Claim the lease for `owner` with the epoch after `current`, committed with the claim; None if the epoch
        is no longer `current` (another instance claimed the task first)."""
        epoch = self.conn.execute(_claim(self.connector, self.task_id, owner, current)).scalar_one_or_none()
        return None if epoch is None else Lease(self.connector, self.task_id, epoch)


class OwnershipStore(StoreBase):
    """Task leases (claims with an epoch, heartbeats, how an instance ended) and each partition's owner and state."""

    def claim_task(self, connector: str, task_id: int, owner: str) -> Lease:
        """Take the task over with a new epoch, fencing any earlier instance."""
        with Session(self.engine) as s, s.begin():
            if s.get(Connector, connector) is None:
                raise UnknownConnectorError(f"connector {connector!r} does not exist")
            return Lease(connector, task_id, s.execute(_claim(connector, task_id, owner)).scalar_one())

    @contextmanager
    def claiming(self, connector: str, task_id: int, wait_s: float) -> Iterator[LeaseClaim]:
        """A transaction claiming the task's lease, committed when the block ends; a wait of it on a lock longer
        than `wait_s` fails (`replicator.state.epoch_locks.lock_timed_out`)."""
        with self.engine.begin() as conn:
            limit_lock_waits(conn, wait_s)
            yield LeaseClaim(conn, connector, task_id)

    def finish_task(self, lease: Lease, state: str, error: str | None = None) -> None:
        """Record how the task instance ended and release its partitions, if it still holds the lease."""
        try:
            with Session(self.engine) as s, s.begin():
                self._fence_check(s, lease, state=state, error=error)
                s.execute(
                    update(PartitionStatus)
                    .where(PartitionStatus.connector == lease.connector, PartitionStatus.task_id == lease.task_id)
                    .values(task_id=None, updated_at=func.now())
                )
        except FencedError:
            pass  # the newer instance owns the row now

    def record_restart(self, connector: str, task_id: int) -> int:
        """Count a restart of the task (Mirus's restart-attempt metrics); returns the task's total."""
        with Session(self.engine) as s, s.begin():
            new = insert(TaskLease).values(connector=connector, task_id=task_id, restart_attempts=1)
            stmt = new.on_conflict_do_update(
                index_elements=[TaskLease.connector, TaskLease.task_id],
                set_={"restart_attempts": TaskLease.restart_attempts + 1},
            ).returning(TaskLease.restart_attempts)
            return s.execute(stmt).scalar_one()

    def leases(self, connector: str) -> dict[int, LeaseRow]:
        """Every task lease of `connector` (tasks assigned now and formerly), by task id."""
        with Session(self.engine) as s:
            rows = s.scalars(select(TaskLease).where(TaskLease.connector == connector))
            return {r.task_id: typed_row(LeaseRow, r) for r in rows}

    def lease_of(self, connector: str, task_id: int) -> LeaseRow | None:
        with Session(self.engine) as s:
            row = s.get(TaskLease, (connector, task_id))
            return typed_row(LeaseRow, row) if row else None

    def claim_partitions(
        self, lease: Lease, partitions: Sequence[SourcePartition], stale_after: timedelta
    ) -> list[SourcePartition]:
        """Take ownership of the partitions no other live task holds; returns those now owned by this task.

        A partition held by another task is taken only once that task released it (after flushing and
        committing) or its lease stopped heartbeating for `stale_after`.
        """
        return sorted(self.claim_partitions_from(lease, partitions, stale_after))

    def claim_partitions_from(
        self, lease: Lease, partitions: Sequence[SourcePartition], stale_after: timedelta
    ) -> dict[SourcePartition, int | None]:
        """`claim_partitions`, telling for each partition taken the other task that held it without releasing it
        (a silent one: exactly-once fences it before writing), or None."""
        if not partitions:
            return {}
        with Session(self.engine) as s, s.begin():
            self._fence_check(s, lease)
            held = dict(
                ((t, p), task)
                for t, p, task in s.execute(
                    select(PartitionStatus.topic, PartitionStatus.partition, PartitionStatus.task_id)
                    .where(
                        PartitionStatus.connector == lease.connector,
                        PartitionStatus.task_id.is_not(None),
                        PartitionStatus.task_id != lease.task_id,
                        status_rows_of(partitions),
                    )
                    .with_for_update()
                )
            )
            # The conflicting row's owner is referenced by name: a correlated subquery cannot be expressed here.
            owner_gone = text(
                "NOT EXISTS (SELECT 1 FROM task_leases l WHERE l.connector = partition_status.connector"
                " AND l.task_id = partition_status.task_id AND l.state = :held"
                " AND l.heartbeat_at > now() - :stale)"
            ).bindparams(stale=stale_after, held=LEASE_HELD)
            pairs = partition_rows(partitions)
            new = insert(PartitionStatus).from_select(
                ["connector", "topic", "partition", "task_id", "state"],
                select(
                    literal(lease.connector),
                    pairs.c.topic,
                    pairs.c.partition,
                    literal(lease.task_id),
                    literal(PartitionHealth.ACTIVE.value),
                ),
            )
            stmt = new.on_conflict_do_update(
                index_elements=[PartitionStatus.connector, PartitionStatus.topic, PartitionStatus.partition],
                set_={
                    "task_id": lease.task_id,
                    "state": PartitionHealth.ACTIVE,
                    "reason": None,
                    "updated_at": func.now(),
                },
                where=or_(PartitionStatus.task_id.is_(None), PartitionStatus.task_id == lease.task_id, owner_gone),
            ).returning(PartitionStatus.topic, PartitionStatus.partition)
            return {(t, p): held.get((t, p)) for t, p in s.execute(stmt)}

    def release_partitions(self, lease: Lease, partitions: Iterable[SourcePartition]) -> None:
        wanted = list(partitions)
        if not wanted:
            return
        with Session(self.engine) as s, s.begin():
            self._fence_check(s, lease)
            s.execute(
                update(PartitionStatus)
                .where(
                    PartitionStatus.connector == lease.connector,
                    PartitionStatus.task_id == lease.task_id,
                    status_rows_of(wanted),
                )
                .values(task_id=None, updated_at=func.now())
            )

    def set_partition_state(
        self, lease: Lease, partition: SourcePartition, state: PartitionHealth, reason: str | None
    ) -> None:
        """A partition's health, with the reason an operator sees."""
        with Session(self.engine) as s, s.begin():
            self._fence_check(s, lease)
            stmt = insert(PartitionStatus).values(
                connector=lease.connector,
                topic=partition[0],
                partition=partition[1],
                task_id=lease.task_id,
                state=state,
                reason=reason,
            )
            s.execute(
                stmt.on_conflict_do_update(
                    index_elements=[PartitionStatus.connector, PartitionStatus.topic, PartitionStatus.partition],
                    set_={"state": state, "reason": reason, "updated_at": func.now()},
                )
            )

    def hold_partitions(
        self, connector: str, held: Mapping[SourcePartition, str], assigned: Iterable[SourcePartition]
    ) -> None:
        """Record the partitions the monitor holds back from assignment (PAUSED, with why), unless a task owns
        the row; unowned PAUSED rows of partitions now neither held nor assigned are removed (stale reasons)."""
        keep = set(held) | set(assigned)
        with Session(self.engine) as s, s.begin():
            if held:
                stmt = insert(PartitionStatus).values(
                    [
                        {
                            "connector": connector,
                            "topic": t,
                            "partition": p,
                            "task_id": None,
                            "state": PartitionHealth.PAUSED,
                            "reason": reason,
                        }
                        for (t, p), reason in sorted(held.items())
                    ]
                )
                s.execute(
                    stmt.on_conflict_do_update(
                        index_elements=[PartitionStatus.connector, PartitionStatus.topic, PartitionStatus.partition],
                        set_={
                            "state": PartitionHealth.PAUSED,
                            "reason": stmt.excluded.reason,
                            "updated_at": func.now(),
                        },
                        where=and_(
                            PartitionStatus.task_id.is_(None),
                            or_(
                                PartitionStatus.state != PartitionHealth.PAUSED,
                                PartitionStatus.reason.is_distinct_from(stmt.excluded.reason),
                            ),
                        ),
                    )
                )
            unowned = s.execute(
                select(PartitionStatus.topic, PartitionStatus.partition).where(
                    PartitionStatus.connector == connector,
                    PartitionStatus.task_id.is_(None),
                    PartitionStatus.state == PartitionHealth.PAUSED,
                )
            ).all()
            stale = [(t, p) for t, p in unowned if (t, p) not in keep]
            if stale:
                s.execute(
                    delete(PartitionStatus).where(
                        PartitionStatus.connector == connector,
                        PartitionStatus.task_id.is_(None),
                        status_rows_of(stale),
                    )
                )

    def unowned_paused(self) -> dict[str, set[SourcePartition]]:
        """Every connector's PAUSED partitions no task owns (those the monitor holds back, and stale ones it
        removes), in one query: the watcher learns which connectors' polls have any to write."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(PartitionStatus.connector, PartitionStatus.topic, PartitionStatus.partition).where(
                    PartitionStatus.task_id.is_(None), PartitionStatus.state == PartitionHealth.PAUSED
                )
            )
            found: dict[str, set[SourcePartition]] = {}
            for connector, topic, partition in rows:
                found.setdefault(connector, set()).add((topic, partition))
            return found

    def partition_statuses(self, connector: str) -> dict[SourcePartition, PartitionStatusRow]:
        return self._partition_statuses(PartitionStatus.connector == connector).get(connector, {})

    def every_partition_status(self) -> dict[str, dict[SourcePartition, PartitionStatusRow]]:
        """`partition_statuses` of every connector, in one query."""
        return self._partition_statuses(true())

    def _partition_statuses(self, where: ColumnElement[bool]) -> dict[str, dict[SourcePartition, PartitionStatusRow]]:
        statuses: dict[str, dict[SourcePartition, PartitionStatusRow]] = {}
        with Session(self.engine) as s:
            for r in s.scalars(select(PartitionStatus).where(where)):
                statuses.setdefault(r.connector, {})[(r.topic, r.partition)] = PartitionStatusRow(
                    r.task_id, PartitionHealth(r.state), r.reason, r.updated_at
                )
        return statuses
