"""A worker: one process hosting the tasks of many connectors, as a Kafka Connect worker does.

A run per task and per standby makes an estate of many small connectors pay a whole process for each; a worker
shares one interpreter, its imports and its Dagster run among all the tasks it hosts. Which tasks a worker hosts is
decided by rendezvous hashing (`hosts`): every task ranks the estate's N workers by a hash of (task, worker) and is
hosted by the first `1 + task.standby.runs` of them (at most N). Adding or removing a connector moves no other task,
and no coordination is needed: each worker reads the connectors and assignments from Postgres and computes its own
share.

Every host runs its copy of the task through `run_owned` (`replicator.engine.ownership`), exactly as a per-task run
does: the first to claim the lease replicates, the others stand by on its epoch lock and take over the moment the
owner's process dies. Leases, fencing and every guarantee of a task are therefore unchanged; a worker only decides
which tasks to start, restarts the ones that failed (doubling backoff, capped, as the supervisor does for runs), and
stops the ones no longer assigned to it.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from replicator.configuration.connector import ConnectorConfigError, load
from replicator.engine.ownership import LockWatch, run_owned
from replicator.engine.task import ReplicationTask, TaskExit
from replicator.state.head_notices import HeadNotices
from replicator.state.records import LEASE_HELD, ConnectorState, UnknownConnectorError
from replicator.state.store import Store

log = logging.getLogger(__name__)

TaskKey = tuple[str, int]  # (connector, task id)

# How often a worker re-reads which tasks it hosts when no notice says so: a new assignment, state or restart is
# told at its commit (`HeadNotices`, any connector's) and read at once; this poll covers a notice lost.
POLL_S = 1.0
RECONCILE_S = 0.02  # the least time between two reads: the notices of a burst of changes are read together
INITIAL_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
HEALTHY_S = 60.0  # a task that ran this long before failing starts its backoff again from the beginning
# A task nobody holds is left this long per rank to its better-ranked hosts, so that the first-ranked one owns it
# when alive and the estate's tasks are spread over the workers, not owned by whichever started first.
DEFER_PER_RANK_S = 10.0
# The worker's standbys ask together this often whether their owners' locks are free, instead of each blocking on
# its own connection (`replicator.engine.ownership.LockWatch`): a takeover up to this much later.
STANDBY_POLL_S = 0.2


@functools.lru_cache(maxsize=65_536)  # asked for every task at every poll: the answer never changes
def hosts(connector: str, task_id: int, workers: int, copies: int) -> tuple[int, ...]:
    """The workers (0 .. workers - 1) hosting the task, best first: `copies` of them, at most all."""

    def weight(worker: int) -> bytes:
        return hashlib.blake2b(f"{connector}\0{task_id}\0{worker}".encode(), digest_size=8).digest()

    return tuple(sorted(range(workers), key=weight, reverse=True)[: max(1, min(copies, workers))])


@dataclass
class HostedTask:
    """A task this worker hosts: its thread (owner or standby), and its failures for the backoff."""

    key: TaskKey
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    started_at: float = 0.0
    failures: int = 0  # in a row, each within HEALTHY_S of its start
    retry_at: float = 0.0
    failed_at: float | None = None  # wall clock of the last failure, against an operator's restart request
    outcome: TaskExit | None = None
    error: BaseException | None = None

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


class TaskWorker:
    """Hosts this worker's share of every running connector's tasks until stopped."""

    def __init__(
        self,
        store: Store,
        index: int,
        workers: int,
        owner: str,
        on_event: Callable[[str], None] | None = None,
        poll_s: float = POLL_S,
    ) -> None:
        if not 0 <= index < workers:
            raise ValueError(f"worker {index} of {workers}: the index must be 0 .. {workers - 1}")
        # Its reads and every hosted task's work share the engine (`replicator.state.database.worker_engine`).
        self.store = store
        self.index, self.workers, self.owner, self.poll_s = index, workers, owner, poll_s
        self.on_event = on_event or (lambda message: log.info("worker %d: %s", index, message))
        self.hosted: dict[TaskKey, HostedTask] = {}
        self.copies: dict[str, tuple[int, int]] = {}  # connector -> (config version, hosts per task)
        self.lock_watch: LockWatch | None = None  # while it runs
        self.notices: HeadNotices | None = None  # while it runs: one LISTEN connection for all its tasks

    def run(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Host tasks until `should_stop`; on the way out (also when interrupted) every task flushes, commits and
        gives its lease back, so the other hosts take over at once."""
        self.on_event(f"worker {self.index} of {self.workers} started")
        self.lock_watch = LockWatch(self.store.engine, STANDBY_POLL_S)
        self.notices = HeadNotices(self.store.engine)
        changed = threading.Event()
        unsubscribe = self.notices.subscribe(None, changed.set)
        try:
            while not should_stop():
                changed.clear()  # before reading: a change committed meanwhile is read again
                try:
                    self.reconcile()
                except SQLAlchemyError as exc:
                    # The database is unreachable: the hosted tasks ride it out on their own (their commits retry),
                    # so the worker keeps them as they are and reads again at its next poll.
                    self.on_event(f"cannot read the connectors ({type(exc).__name__}); hosted tasks continue")
                read_at = time.monotonic()
                while not should_stop() and time.monotonic() < read_at + self.poll_s:
                    if changed.wait(min(0.1, self.poll_s)):
                        # At once, but at most one read every RECONCILE_S however many notices come.
                        time.sleep(max(0.0, read_at + RECONCILE_S - time.monotonic()))
                        break
        finally:
            unsubscribe()
            self.stop_all()
            self.lock_watch.close()
            self.notices.close()

    def wanted(self) -> dict[TaskKey, float | None]:
        """The tasks this worker hosts now, each with the time an operator last asked for its restart (epoch s)."""
        tasks: dict[TaskKey, float | None] = {}
        assigned = self.store.current_task_ids()
        for record in self.store.list_connectors():
            if record.state != ConnectorState.RUNNING:
                continue
            copies = self._copies_of(record.name, record.version, record.properties)
            if copies is None:
                continue  # a config that does not load: the watcher reports it
            requested = record.restart_requested_at.timestamp() if record.restart_requested_at else None
            for task_id in assigned.get(record.name, ()):
                if self.index in hosts(record.name, task_id, self.workers, copies):
                    tasks[(record.name, task_id)] = requested
        return tasks

    def _copies_of(self, connector: str, version: int, properties: dict[str, Any]) -> int | None:
        """How many workers host each of the connector's tasks, loaded once per config version."""
        known = self.copies.get(connector)
        if known is None or known[0] != version:
            try:
                known = (version, 1 + load(properties).task_standby_runs)
            except ConnectorConfigError:
                return None
            self.copies[connector] = known
        return known[1]

    def reconcile(self) -> None:
        """Start the tasks this worker should host and does not, stop those it should no longer host."""
        wanted = self.wanted()
        now = time.monotonic()
        for key, hosted in list(self.hosted.items()):
            if hosted.thread is not None and not hosted.running:
                self._ended(hosted, now)
            if key not in wanted:
                if hosted.running:
                    hosted.stop.set()  # flushes, commits and releases; the next reconcile forgets it
                else:
                    del self.hosted[key]
        for key, restart_requested in wanted.items():
            hosted = self.hosted.setdefault(key, HostedTask(key))
            if hosted.running:
                continue
            failed_at = hosted.failed_at
            requested = failed_at is not None and restart_requested is not None and restart_requested > failed_at
            if now < hosted.retry_at and not requested:
                continue
            self._start(hosted, now)

    def stop_all(self, timeout_s: float = 60.0) -> None:
        for hosted in self.hosted.values():
            hosted.stop.set()
        deadline = time.monotonic() + timeout_s
        for hosted in self.hosted.values():
            if hosted.thread is not None:
                hosted.thread.join(max(0.0, deadline - time.monotonic()))

    def _start(self, hosted: HostedTask, now: float) -> None:
        connector, task_id = hosted.key
        if hosted.failures:
            self.store.record_restart(connector, task_id)
        hosted.stop = threading.Event()
        hosted.outcome = hosted.error = None
        hosted.started_at = now
        hosted.thread = threading.Thread(
            target=self._host, args=(hosted,), daemon=True, name=f"mirus-worker-{connector}-{task_id}"
        )
        hosted.thread.start()

    def _host(self, hosted: HostedTask) -> None:
        connector, task_id = hosted.key
        name = f"{connector}-{task_id}"
        try:
            self._defer(connector, task_id, hosted.stop)
            task = ReplicationTask(
                self.store,
                connector,
                task_id,
                self.owner,
                on_event=lambda m: self.on_event(f"{name}: {m}"),
                notices=self.notices,
            )
            hosted.outcome = run_owned(task, hosted.stop.is_set, self.lock_watch)
        except UnknownConnectorError:
            hosted.outcome = TaskExit.DELETED
        except Exception as exc:  # the task cleaned up and recorded its failure on its lease; the worker goes on
            hosted.error = exc
        finally:
            if hosted.error is None:
                ended = hosted.outcome.value if hosted.outcome else "stood by until stopped"
                self.on_event(f"{name} ended: {ended}")

    def _defer(self, connector: str, task_id: int, stop: threading.Event) -> None:
        """Give the task's better-ranked hosts their turn to claim it, unless someone holds it already (then this
        one stands by at once, to take over the moment the owner dies)."""
        rank = hosts(connector, task_id, self.workers, self.workers).index(self.index)
        deadline = time.monotonic() + rank * DEFER_PER_RANK_S
        while time.monotonic() < deadline:
            lease = self.store.lease_of(connector, task_id)
            if lease is not None and lease.state == LEASE_HELD:
                return
            if stop.wait(0.2):  # the worker stops hosting it: no need to wait the turn out
                return

    def _ended(self, hosted: HostedTask, now: float) -> None:
        connector, task_id = hosted.key
        hosted.thread = None
        if hosted.error is None:
            hosted.failures, hosted.retry_at, hosted.failed_at = 0, 0.0, None
            return
        lived = now - hosted.started_at
        hosted.failures = 1 if lived >= HEALTHY_S else hosted.failures + 1
        wait = 0.0 if hosted.failures <= 1 else min(INITIAL_BACKOFF_S * 2 ** (hosted.failures - 2), MAX_BACKOFF_S)
        hosted.retry_at, hosted.failed_at = now + wait, time.time()
        self.on_event(
            f"{connector}-{task_id} failed ({hosted.failures} in a row): {hosted.error!r}; restart in {wait:.0f}s"
        )
