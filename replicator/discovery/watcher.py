"""The metadata watcher: twice a second, each cluster's metadata is read once, however many connectors read it.

A long-running loop (the `metadata_watcher` Dagster run) in place of a sensor tick, so that discovery does not wait
for the sensor daemon's 5 s loop. Each round it lists the running connectors, reads every distinct cluster (same
client settings) with one Metadata request on a client it keeps, and runs `KafkaMonitor.poll` — with those
readings — only for connectors whose config, assignment generation or clusters' metadata changed since their last
successful poll and whose planned partitions changed with them; the monitor writes a new assignment generation,
which running tasks pick up within a second.
Destination topic creations and growths are asked in one round and collected in a later one (`TopicRequests`,
kept here across rounds): a controller busy for tens of seconds never holds up the round. A connector is polled
again as soon as an outcome it waits for arrives, and the next round starts early for it.
A cluster that cannot be read puts its connectors on Mirus's backoff (1, 2 … 64 s); the others are unaffected.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from confluent_kafka.admin import AdminClient
from sqlalchemy.exc import SQLAlchemyError

from replicator.assignment import SourcePartition
from replicator.clusters import ClusterAdmin, ClusterView, MetadataUnavailableError, read_cluster, settings_key
from replicator.configuration.connector import ConnectorConfig, ConnectorConfigError, load
from replicator.discovery.heartbeats import HeartbeatProducers
from replicator.discovery.monitor import KafkaMonitor, MonitorResult, PollMemory, plan_partitions
from replicator.discovery.topic_sync import TopicRequests
from replicator.state.records import ConnectorRecord, ConnectorState, UnknownConnectorError
from replicator.state.store import Store

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.5  # a new topic waits at most this long to be seen (a round that overruns is followed at once)
WATCH_PROBLEM = "watch"  # the flow problem naming what keeps the watcher from polling a connector
MAX_BACKOFF_S = 64.0  # Mirus: retriable monitor errors back off 1, 2, 4 … 64 s


class ClusterReadings:
    """One round's metadata, read at most once per cluster; the admin clients outlive the round."""

    def __init__(self, clients: dict[str, AdminClient]) -> None:
        self.clients = clients
        self.used: set[str] = set()
        self.views: dict[str, ClusterView | MetadataUnavailableError] = {}
        self.requests: Counter[str] = Counter()  # bootstrap servers -> metadata requests this round
        self.fingerprints: dict[str, str] = {}

    def client(self, settings: Mapping[str, str]) -> AdminClient:
        """The cluster's long-lived admin client (one per cluster and settings, for reads and for the duties)."""
        key = settings_key(settings)
        self.used.add(key)
        client = self.clients.get(key)
        if client is None:
            client = self.clients[key] = ClusterAdmin(dict(settings))
        return client

    def read(self, settings: Mapping[str, str], cluster: str) -> ClusterView:
        """The cluster as `replicator.clusters.read_cluster` shows it, read once a round."""
        key = settings_key(settings)
        if key not in self.views:
            client = self.client(settings)
            self.requests[str(settings.get("bootstrap.servers"))] += 1
            try:
                self.views[key] = read_cluster(client, cluster)
            except MetadataUnavailableError as exc:
                self.views[key] = exc
        seen = self.views[key]
        if isinstance(seen, MetadataUnavailableError):
            raise seen
        return seen

    def fingerprint(self, settings: Mapping[str, str], cluster: str) -> str:
        """What the cluster showed this round, in a few bytes (computed once per cluster)."""
        key = settings_key(settings)
        if key not in self.fingerprints:
            try:
                topics = json.dumps(sorted(self.read(settings, cluster).partition_counts().items())).encode()
                self.fingerprints[key] = hashlib.blake2b(topics).hexdigest()
            except MetadataUnavailableError as exc:
                self.fingerprints[key] = str(exc)
        return self.fingerprints[key]


@dataclass
class ConnectorWatch:
    seen: tuple[object, ...] = ()  # version, generation and both clusters' fingerprints at the last look
    due_at: float = 0.0  # the next poll for the monitor's periodic duties (monitor.poll.wait.ms)
    planned: tuple[object, ...] = ()  # version, generation and the partitions planned at the last successful poll
    retry_at: float = 0.0
    failures: int = 0
    error: str | None = None
    # Whether an error of ours may be on the connector's flow problems (metadata errors show by themselves). At first
    # unknown (an earlier watcher run may have put one there): the first successful poll clears it.
    shown: bool = True


@dataclass
class WatchRound:
    """What one round did: metadata requests per cluster, connectors polled, changes and errors."""

    requests: Counter[str] = field(default_factory=Counter)
    polled: list[str] = field(default_factory=list)
    changed: list[MonitorResult] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


class MetadataWatcher:
    def __init__(
        self,
        store: Store,
        *,
        interval_s: float = WATCH_INTERVAL_S,
        on_change: Callable[[MonitorResult], None] = lambda result: None,
        on_error: Callable[[str, str | None], None] = lambda connector, error: None,
    ) -> None:
        """`on_change`: a new assignment generation was written; `on_error`: a connector's error appeared or
        cleared (None)."""
        self.store = store
        self.interval_s = interval_s
        self.on_change, self.on_error = on_change, on_error
        self.clients: dict[str, AdminClient] = {}
        self.watches: dict[str, ConnectorWatch] = {}
        self.configs: dict[tuple[str, int], ConnectorConfig] = {}
        self.topic_requests = TopicRequests()
        self.heartbeat_producers = HeartbeatProducers()
        self.memory = PollMemory()
        self.flow_writes: dict[str, dict[str, object]] = {}  # this round's flow changes, written together at its end

    def run(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Watch until `should_stop`; a round starts every `interval_s` (at once when the last one overran, or when
        a destination topic's creation or growth settled: its partitions wait for the round that collects it)."""
        try:
            while not should_stop():
                started = time.monotonic()
                try:
                    self.watch_once()
                except SQLAlchemyError as exc:  # the database is away: discovery resumes when it is back
                    log.warning("metadata watcher: the platform database is unavailable, will retry: %s", exc)
                while (
                    not should_stop()
                    and not self.topic_requests.settled.is_set()
                    and (left := self.interval_s - (time.monotonic() - started)) > 0
                ):
                    self.topic_requests.settled.wait(min(left, 0.2))  # short waits: a termination lands between them
        finally:
            self.close()

    def close(self) -> None:
        """Close the clients kept across rounds: the heartbeat producers, and the admin clients (destroyed as they
        are dropped: an AdminClient has no `close`)."""
        self.heartbeat_producers.close()
        self.clients.clear()

    def watch_once(self) -> WatchRound:
        started = time.monotonic()
        self.topic_requests.settled.clear()  # outcomes that arrive from now on start the next round early
        readings = ClusterReadings(self.clients)
        done = WatchRound()
        records = [r for r in self.store.list_connectors() if r.state == ConnectorState.RUNNING]
        paused = functools.cache(self.store.unowned_paused)  # read once a round, by its first poll
        for record in records:
            self._watch(record, readings, paused, done)
        self._write_flows()
        self._forget_all_but({r.name for r in records}, readings)
        done.requests = readings.requests
        done.seconds = time.monotonic() - started
        return done

    def _watch(
        self,
        record: ConnectorRecord,
        readings: ClusterReadings,
        paused: Callable[[], dict[str, set[SourcePartition]]],
        done: WatchRound,
    ) -> None:
        """Poll the connector if what it would replicate changed or its periodic poll is due; the outcome in `done`."""
        watch = self.watches.setdefault(record.name, ConnectorWatch())
        if time.monotonic() < watch.retry_at:
            return
        try:
            config = self._config(record.name, record.version, record.properties)
            seen = (
                record.version,
                record.assignment_generation,
                readings.fingerprint(config.admin_settings("source"), "source"),
                readings.fingerprint(config.admin_settings("destination"), "destination"),
            )
            due = time.monotonic() >= watch.due_at or self.topic_requests.ready(record.name)
            if seen == watch.seen and not due:
                return
            # A cluster changed; only a change of what this connector would replicate is worth a poll before
            # its periodic one (a topic another connector reads must not make a hundred connectors poll).
            planned = (record.version, record.assignment_generation, self._plan(config, readings))
            if planned == watch.planned and not due:
                watch.seen = seen
                return
            done.polled.append(record.name)
            result = self._poll(record, config, readings, paused)
            watch.due_at = time.monotonic() + config.monitor_poll_wait_ms / 1000
        except MetadataUnavailableError as exc:  # recorded with the failed snapshot: the connector shows it
            self._failed(record.name, watch, str(exc))
            done.errors[record.name] = str(exc)
            return
        except UnknownConnectorError:
            return  # deleted while we looked
        except Exception as exc:  # one broken connector must not stop discovery for the others
            error = str(exc) if isinstance(exc, ConnectorConfigError) else f"{type(exc).__name__}: {exc}"
            self._failed(record.name, watch, error, show=True)
            done.errors[record.name] = error
            return
        # The generation we just wrote is part of what we saw: it must not trigger another poll.
        watch.seen = (*seen[:1], result.generation, *seen[2:])
        watch.planned = (*planned[:1], result.generation, *planned[2:])
        self._recovered(record.name, watch)
        if result.changed:
            done.changed.append(result)
            self.on_change(result)

    def _poll(
        self,
        record: ConnectorRecord,
        config: ConnectorConfig,
        readings: ClusterReadings,
        paused: Callable[[], dict[str, set[SourcePartition]]],
    ) -> MonitorResult:
        """The connector's monitor poll, reading the clusters through this round's shared readings."""
        monitor = KafkaMonitor(
            self.store,
            read_view=self._shared(config, readings),
            admin_for=readings.client,
            topic_requests=self.topic_requests,
            heartbeat_producers=self.heartbeat_producers,
            memory=self.memory,
            unowned_paused=lambda name: paused().get(name, set()),
            flow_writes=self.flow_writes,
        )
        return monitor.poll(record.name, record, config)

    def _recovered(self, name: str, watch: ConnectorWatch) -> None:
        """A poll succeeded: the connector's error, if it had one, is cleared and its backoff reset."""
        if watch.error is not None:
            self.on_error(name, None)
        if watch.shown:
            self._show(name, None)
        watch.failures, watch.retry_at, watch.error, watch.shown = 0, 0.0, None, False

    def _forget_all_but(self, names: set[str], readings: ClusterReadings) -> None:
        """Drop what is kept for connectors no longer running, and the clients of clusters none of them reads."""
        self.watches = {n: w for n, w in self.watches.items() if n in names}
        self.configs = {k: c for k, c in self.configs.items() if k[0] in names}
        self.topic_requests.keep(names)
        self.heartbeat_producers.keep(names, readings.used)
        self.memory.keep(names)
        for key in set(self.clients) - readings.used:
            del self.clients[key]  # no running connector reads that cluster any more

    def _config(self, name: str, version: int, properties: Mapping[str, object]) -> ConnectorConfig:
        config = self.configs.get((name, version))
        if config is None:
            config = self.configs[(name, version)] = load(dict(properties))
        return config

    @staticmethod
    def _shared(config: ConnectorConfig, readings: ClusterReadings) -> Callable[[AdminClient, str], ClusterView]:
        """The monitor's cluster reader: this round's shared reading of the connector's cluster in that role."""

        def read(_admin: AdminClient, role: str) -> ClusterView:
            return readings.read(config.admin_settings("source" if role == "source" else "destination"), role)

        return read

    @staticmethod
    def _plan(config: ConnectorConfig, readings: ClusterReadings) -> object:
        try:
            source = readings.read(config.admin_settings("source"), "source").partition_counts()
            destination = readings.read(config.admin_settings("destination"), "destination").partition_counts()
        except MetadataUnavailableError as exc:
            return str(exc)  # the poll reports it
        plan = plan_partitions(config, source, destination)
        return (tuple(plan.replicate), tuple(plan.missing_destination), tuple(plan.cycles))

    def _failed(self, name: str, watch: ConnectorWatch, error: str, show: bool = False) -> None:
        watch.seen = watch.planned = ()
        watch.due_at = 0.0
        watch.retry_at = time.monotonic() + min(2.0**watch.failures, MAX_BACKOFF_S)
        watch.failures += 1
        if error != watch.error:
            self.on_error(name, error)
            if show:
                watch.shown = self._show(name, error) or watch.shown
            elif watch.shown and self._show(name, None):
                watch.shown = False  # a metadata error now: its failed snapshot shows it
        watch.error = error

    def _write_flows(self, only: str | None = None) -> None:
        """Write the round's flow changes (or `only` that connector's) in one transaction. If that fails, the polls
        that made them read their flows again next time (the database is the truth)."""
        names = list(self.flow_writes) if only is None else [only] if only in self.flow_writes else []
        writes = {name: self.flow_writes.pop(name) for name in names}
        if not writes:
            return
        try:
            self.store.update_flows(writes)
        except SQLAlchemyError as exc:
            log.warning("metadata watcher: flows of %d connector(s) not written, will retry: %s", len(writes), exc)
            for name in writes:
                self.memory.forget(name)

    def _show(self, name: str, error: str | None) -> bool:
        """Put `error` on the connector's flow problems (the connectors view shows them), or clear it (None)."""
        self._write_flows(only=name)  # this round's changes first: the problems are read back from the row
        try:
            problems = dict(self.store.flow(name).problems)
            if problems.get(WATCH_PROBLEM) == error:
                return True
            problems.pop(WATCH_PROBLEM, None)
            self.store.update_flow(name, problems={**problems, **({WATCH_PROBLEM: error} if error else {})})
            self.memory.forget(name)  # the flow its polls remember is no longer the stored one
        except SQLAlchemyError as exc:
            log.warning("%s: could not record the watcher's error %r: %s", name, error, exc)
            return False
        return True
