"""One replicator task: a consumer on the source cluster and a producer on the destination, for a set of
source partitions of one connector.

A record's path, top to bottom, is the loop in `ReplicationTask.run`:
  fetch, map, produce   `Forwarder.poll_once` (`replicator.engine.forwarder`): records from the source reader
                        (`replicator.engine.source_reader`) to the destination producers
  acknowledge           `Deliveries.acknowledged` (`replicator.engine.deliveries`): the destination's
                        acknowledgements into the partition book (`replicator.engine.partitions`); a refusal or a
                        failed producer is kept there as data
  settle                `Committer.settle`, first in `Committer.tick`: the delivery mode's committer decides what
                        the refusals and a failed producer do, with `DeliveryFailures` (`replicator.engine.failures`)
  commit                `Committer.tick` (`replicator.engine.committer`): every `offset.flush.interval.ms`, each
                        partition's first unacknowledged offset to Postgres under the lease epoch, on a background
                        thread; exactly-once mode's `TransactionalCommitter` (`replicator.engine.transactions`)
                        commits a destination transaction first
and beside it `AssignmentFollower.tick` (`replicator.engine.follower`): the connector's pause, delete, restart,
configuration versions and assignment generations, paused partitions' retries; destination partitions
(`replicator.engine.destinations`) and single partitions' pauses (`replicator.engine.pauses`). Periodic duties are
named in one `Scheduler` (`replicator.engine.scheduler`).

The parts are wired here, each given what it uses and never the task: those that live as long as the task in
`__init__`, the clients (`Clients`, `replicator.engine.clients`) and the parts made with them in `rebuild`, which hands
each new set of clients to the parts that outlive them (`use`). The lease, claimed by `run` after a warm standby made
its parts, reaches them through a function that returns it.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from sqlalchemy.exc import SQLAlchemyError

from replicator.configuration.connector import load
from replicator.engine.clients import Clients, Identified, identify
from replicator.engine.committer import Committer, CommitWatchdogError
from replicator.engine.deliveries import Deliveries
from replicator.engine.destinations import Destinations
from replicator.engine.failures import DeliveryFailures
from replicator.engine.follower import AssignmentFollower, Rebuild, TaskExit
from replicator.engine.forwarder import Forwarder
from replicator.engine.metrics import TaskMetrics
from replicator.engine.partitions import PartitionBook
from replicator.engine.pauses import PartitionPauses
from replicator.engine.record_limits import LIMITS_REFRESH_S, RecordLimits
from replicator.engine.scheduler import READING_SIZE_LIMITS, RECORDING_METRICS, RESTING, Scheduler
from replicator.engine.source_reader import DEFAULT_LIMITS, SourceReader, TierLimits
from replicator.engine.throttle import ThrottleShare, only_throttle_changed
from replicator.engine.transactions import TransactionalCommitter
from replicator.state.head_notices import HeadNotices
from replicator.state.records import FencedError, Lease, MetricInterval
from replicator.state.store import Store

__all__ = ["CommitWatchdogError", "ReplicationTask", "TaskExit"]

log = logging.getLogger(__name__)

YOUNG_GC_THRESHOLD = 50_000  # allocations between young garbage collections (see `ReplicationTask.run`)
REST_INTERVAL_S = 1.0  # "resting": flowing partitions that went quiet move to the reader's quiet tier
# Lags are read from every partition's watermarks only when a batch was read or a run acknowledged since the last
# reading (`PartitionBook.touched`: an unpaused partition's new record is fetched at once), and at least this often.
UNTOUCHED_LAGS_S = 60.0
# How long a stop waits for the destination to acknowledge what is in flight: what it has not acknowledged by then is
# read again by the next owner. A stop must end well within the 10 s that Kubernetes and Docker give a process
# before they kill it, the final commit and the clients' closing included.
STOP_DRAIN_S = 5.0


class ReplicationTask:
    def __init__(
        self,
        store: Store,
        connector: str,
        task_id: int,
        owner: str,
        *,
        metrics_interval_s: float = 10.0,
        reader_limits: TierLimits = DEFAULT_LIMITS,
        on_event: Callable[[str], None] | None = None,
        notices: HeadNotices | None = None,
    ) -> None:
        self.store = store
        self.connector = connector
        self.task_id = task_id
        self.owner = owner
        self.metrics = TaskMetrics(task_id, metrics_interval_s)
        self.reader_limits = reader_limits
        self.on_event = on_event or (lambda message: log.info("%s-%d: %s", connector, task_id, message))
        self.should_stop: Callable[[], bool] = lambda: False  # given by `run` (and `run_owned`, before `prepare`)
        self.book = PartitionBook()
        self.limits = RecordLimits()  # the record size limits of the topics served (`replicator.engine.record_limits`)
        self.scheduler = Scheduler()
        # Set when Postgres says the connector's row changed (`notices`): read at the loop's next turn.
        self.head_changed = threading.Event()
        self.notices = notices
        self.scheduler.ran(RECORDING_METRICS, metrics_interval_s)  # the first interval ends one interval from now
        # Postgres commits, metric rows and destination metadata requests: one thread beside the loop, never blocking
        # a record, its results applied by the loop (the committer's and the follower's ticks).
        self.background = ThreadPoolExecutor(1, thread_name_prefix=f"mirus-{connector}-{task_id}")
        self.lease: Lease  # claimed by `run`, after the parts are made (a warm standby makes them first)
        # The parts that live as long as the task; the clients and the parts made with them are made by `rebuild`.
        name = f"{connector}-{task_id}"
        self.throttle = ThrottleShare()
        self.pauses = PartitionPauses(store, self.held_lease, self.book, self.on_event, name)
        self.destinations = Destinations(self.pauses, self.book, self.scheduler, self.background, name)
        self.follower = AssignmentFollower(
            store,
            self.held_lease,
            connector,
            task_id,
            book=self.book,
            limits=self.limits,
            scheduler=self.scheduler,
            background=self.background,
            head_changed=self.head_changed,
            heard=notices.heard if notices else lambda: False,
            on_event=self.on_event,
            pauses=self.pauses,
            destinations=self.destinations,
            throttle=self.throttle,
        )
        # Made by `rebuild` (the clients, and the parts made with them) before anything uses them.
        self.clients: Clients
        self.committer: Committer
        self.forwarder: Forwarder
        self.clients_open = False
        self.identified: Identified | None = None  # the clusters last identified (`identify`)
        # Whether this instance holds the task: a standby's producer must not `init_transactions` (fencing the owner's).
        self.owning = False
        self.lags_read: tuple[int, float] | None = None  # `PartitionBook.touched` and the time at the last reading

    def held_lease(self) -> Lease:
        """The lease this instance holds (given to the parts that write under it; claimed after they are made)."""
        return self.lease

    # -- lifecycle --------------------------------------------------------------------------------------

    def run(
        self, should_stop: Callable[[], bool] = lambda: False, lease: Lease | None = None, stood_by_s: float = 0.0
    ) -> TaskExit:
        """Replicate until stopped, removed, paused, deleted or fenced. Raises on failure (after cleaning up).

        `lease`: a claim already taken (`replicator.engine.ownership`), after standing by `stood_by_s`; without it the
        task claims now, fencing any owner.
        """
        # A batch of up to 10,000 records outlives many young collections at Python's default threshold (700): its
        # objects are promoted, and full collections come every few seconds at high rates. (Per process: all alike.)
        gc.set_threshold(YOUNG_GC_THRESHOLD, *gc.get_threshold()[1:])
        self.should_stop = should_stop
        self.lease = lease or self.store.claim_task(self.connector, self.task_id, self.owner)
        self.owning = True
        outcome: TaskExit | None = None
        error: BaseException | None = None
        unsubscribe = self.notices.subscribe(self.connector, self.head_changed.set) if self.notices else None
        try:  # from here on a termination (even while the first events are written) ends with a final commit
            if stood_by_s:
                self.on_event(f"took over after standing by {stood_by_s:.1f}s")
            self.on_event(f"claimed with epoch {self.lease.epoch}")
            if self.clients_open:  # prepared while standing by: its transactions start now, fencing the last owner
                self.committer.start()
            outcome = self.refresh(force=True)
            while outcome is None:
                if should_stop():
                    outcome = TaskExit.STOPPED
                    break
                self.forwarder.poll_once()  # fetch, map, produce, acknowledge
                now = time.monotonic()
                self.committer.tick(now)  # settle refusals and failures, commit
                # The connector, its assignment, destinations, paused partitions.
                outcome = self._follow(self.follower.tick(now))
                self._rest_and_record(now)
            return outcome
        except FencedError as exc:
            outcome = TaskExit.FENCED
            self.on_event(str(exc))
            return outcome
        except BaseException as exc:  # includes Dagster's run termination, delivered as a BaseException
            error = exc
            raise
        finally:
            if unsubscribe is not None:
                unsubscribe()
            self._shutdown(outcome, error)

    def refresh(self, force: bool = False) -> TaskExit | None:
        """Read the connector's row and follow it (its clients made first, when they are none or outdated)."""
        return self._follow(self.follower.refresh(self.store.connector_head(self.connector), force))

    def _follow(self, outcome: TaskExit | Rebuild | None) -> TaskExit | None:
        """Make the clients again as long as the follower says so, letting it go on after each time."""
        while isinstance(outcome, Rebuild):
            if again := self.rebuild(outcome.version, outcome.restart_marker, outcome.why):
                outcome = again._replace(head=outcome.head, force=outcome.force)  # then go on as asked first
            else:
                outcome = self.follower.after_rebuild(outcome)
        return outcome

    def prepare(self) -> None:
        """Create and connect the clients before owning the task (a warm standby): `run` then starts replicating
        at once, unless the configuration changed meanwhile."""
        head = self.store.connector_head(self.connector)
        if head is None:
            return
        self._follow(Rebuild(head.version, head.restart_requested_at))
        # The producer connected and holding the metadata of one of its topics (never the whole cluster's) before it
        # is needed. The source consumers are made at the takeover, in the quiet tier (answered at the first byte).
        mine = self.store.read_assignment(self.connector).get(self.task_id)
        if mine:
            clients = self.clients
            try:
                clients.deliveries.producer.list_topics(clients.config.namer.destination_topic(mine[0][0]), timeout=5)
            except Exception as exc:  # only slower later: the task loop reports real trouble
                log.info("%s-%d: warming up the producer failed: %s", self.connector, self.task_id, exc)

    def discard(self) -> None:
        """Close the clients of a task that was prepared but never ran."""
        if self.clients_open:
            self.close_clients()

    def close_clients(self) -> None:
        """Close the source consumers and the destination producers (what they still hold is dropped)."""
        self.clients_open = False  # a failure while closing has nothing left to close
        self.clients.close()

    def rebuild(self, version: int, restart_marker: object, why: str | None = None) -> Rebuild | None:
        """(Re)create clients for the current configuration, resuming every owned partition from its commit (`why`:
        for another reason than a new version, e.g. record size limits the clients no longer fit), and hand them to
        the parts. Returns a `Rebuild` if the partitions' limits, read only now, need other clients still."""
        record = self.store.get_connector(self.connector)
        config = load(record.properties)
        if (
            why is None
            and self.clients_open
            and restart_marker == self.clients.restart_marker
            and only_throttle_changed(self.clients.config, config)
        ):
            self._use(replace(self.clients, config=config, version=record.version), self.committer)
            self.throttle.share(config, self.follower.tasks)
            self.on_event(f"configuration version {record.version}: throttle changed, clients kept")
            return None
        owned = sorted(self.book.states)
        last: Committer | None = None
        if self.clients_open:
            self.on_event(f"{why or f'configuration version {record.version}'}: restarting clients in place")
            self.clients.deliveries.drain(10)
            self.committer.commit_now()
            last = self.committer
            self.close_clients()  # until the new ones are made: a failure in between has nothing left to close
        self.identified = identify(config, self.identified, self.on_event)
        # Clients sized for the topics the task serves: those it owns and those assigned to it (a first start owns
        # none yet), their limits read first (only those never read: one request per cluster).
        assigned = self.store.read_assignment(self.connector).get(self.task_id, [])
        self.limits.serve(config, {topic for topic, _ in [*owned, *assigned]}, only=True)
        self.limits.learn(config)
        self.scheduler.ran(READING_SIZE_LIMITS, LIMITS_REFRESH_S)
        consumer, producer = self.limits.client_settings(config, self.task_id)
        reader = SourceReader(consumer, self.reader_limits)
        lanes = None
        if config.copy_mode == "batches":
            from replicator.engine.batch_lanes import BatchLanes, Provenance  # (with kafka-python: 0.1 s of a start)

            producer_ids = Provenance(self.store, self.held_lease, *self.identified[1:])
            lanes = BatchLanes.open(config, self.book, reader, self.metrics, self.on_event, producer_ids)
        deliveries = Deliveries(
            producer,
            self.book,
            self.metrics,
            ordered_acks=config.ordered_acks,
            grouped=not config.exactly_once,
            idle_close_s=reader.quiet_after_s + reader.dormant_after_s,
            name=f"{self.connector}-{self.task_id}",
        )
        sized_for = self.limits.sizes_of(config, self.task_id)
        clients = Clients(
            config, record.version, restart_marker, sized_for, *self.identified[1:], reader, deliveries, lanes
        )
        # What refusals and a failed producer do is decided by the delivery mode's committer, with `DeliveryFailures`.
        failures = DeliveryFailures(deliveries, self.book, self.pauses, self.on_event)
        mode = TransactionalCommitter if config.exactly_once else Committer
        self.committer = committer = mode(
            self.store,
            self.held_lease,
            self.connector,
            self.task_id,
            book=self.book,
            metrics=self.metrics,
            scheduler=self.scheduler,
            background=self.background,
            on_event=self.on_event,
            should_stop=self.should_stop,
            clients=clients,
            destinations=self.destinations,
            failures=failures,
        )
        committer.watch_on(last)
        self.forwarder = Forwarder(
            clients,
            self.book,
            committer,
            source_error=self.pauses.source_error,
            head_changed=self.head_changed,
            throttle=self.throttle,
        )
        self.throttle.share(config, self.follower.tasks)
        if self.owning:
            committer.start()
        self._use(clients, committer)
        self.clients_open = True
        was_paused = list(self.book.paused)
        self.book.clear()
        again = self.follower.start(owned)
        self.pauses.restarted(was_paused)
        return again

    def _use(self, clients: Clients, committer: Committer) -> None:
        """Hand the clients (and the committer made with them) to the parts that outlive them."""
        self.clients = clients
        self.pauses.use(clients)
        self.destinations.use(clients)
        self.follower.use(clients, committer)

    def _shutdown(self, outcome: TaskExit | None, error: BaseException | None) -> None:
        fenced = outcome is TaskExit.FENCED
        try:
            if self.clients_open and not fenced:  # (without clients, `finish_task` alone says whether it was fenced)
                self.clients.deliveries.drain(STOP_DRAIN_S)
                self.committer.commit_now(final=True)
                self._record_metrics()
        except FencedError:
            fenced = True
        except Exception as exc:  # the original outcome matters more than a failed final commit
            log.warning("final commit of %s-%d failed: %s", self.connector, self.task_id, exc)
        finally:
            try:
                self.background.shutdown(wait=True)
                if self.clients_open:
                    self.close_clients()
                if not fenced:
                    state = "FAILED" if isinstance(error, Exception) else (outcome.value if outcome else "STOPPED")
                    self.store.finish_task(self.lease, state, f"{type(error).__name__}: {error}" if error else None)
            finally:  # a second termination while closing must not cost the run its last event
                self.on_event(f"stopped: {outcome.value if outcome else type(error).__name__}")

    # -- the loop's other duties ------------------------------------------------------------------------

    def _rest_and_record(self, now: float) -> None:
        if self.scheduler.due(RESTING, REST_INTERVAL_S, now):
            self.clients.reader.retier(self.book.next_offset)
            self.clients.deliveries.close_idle_producers(now)
        if self.scheduler.due(RECORDING_METRICS, self.metrics.interval_s, now):
            self._record_metrics(now)

    def _record_metrics(self, now: float | None = None) -> None:
        """This interval's samples and changed lags, written in the background (`now` None: a final reading)."""
        touched, read = self.book.touched, self.lags_read
        if now is not None and read is not None and read[0] == touched and now - read[1] < UNTOUCHED_LAGS_S:
            lags = None  # nothing moved: the lags last read stand
        else:
            reader, lanes = self.clients.reader, self.clients.lanes
            lags = self.book.lags(reader.watermarks if lanes is None else lanes.watermarks)
            self.lags_read = (touched, now or time.monotonic())
        self.background.submit(self._store_metrics, self.metrics.drain(lags))

    def _store_metrics(self, interval: MetricInterval) -> None:
        try:
            self.store.record_metrics(self.connector, interval)
        except SQLAlchemyError as exc:
            log.warning("metrics of %s-%d not recorded: %s", self.connector, self.task_id, exc)
