"""Prometheus metrics read from the platform's store at scrape time: one scrape covers every task of every run.

Each metric replaces a Mirus JMX attribute (see docs/API.md, "Metrics"). Latency and throughput are labelled
with the connector and the DESTINATION topic, as Mirus's `mirus:type=MirusSourceConnector,topic=*` beans are;
lag is per source partition. The batch path's hand-backs are per connector and reason.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from replicator.configuration import administration
from replicator.configuration.connector import ConnectorConfig, ConnectorConfigError, load
from replicator.discovery.heartbeats import liveness_s
from replicator.discovery.monitor import plan_partitions
from replicator.engine.metrics import BUCKET_LABELS, HAND_BACK_REASONS
from replicator.state.records import LEASE_HELD, PartitionHealth, TopicTotals
from replicator.state.store import Store

RATE_WINDOW_S = 60.0
TASK_STATES = ("RUNNING", "PAUSED", "FAILED", "UNASSIGNED")


def _seconds(bound_ms: str) -> str:
    return bound_ms if bound_ms == "+Inf" else repr(int(bound_ms) / 1000)


@dataclass
class _Totals:
    """One destination topic's sums (several source topics may be routed to it)."""

    records: int = 0
    bytes: int = 0
    latency_sum_ms: int = 0
    histogram: Counter[str] = field(default_factory=Counter)
    resent: int = 0
    batch_records: int = 0
    batch_bytes: int = 0

    def add(self, t: TopicTotals) -> None:
        self.records += t.records
        self.bytes += t.bytes
        self.latency_sum_ms += t.latency_sum_ms
        self.histogram.update(t.histogram)
        self.resent += t.resent
        self.batch_records += t.batch_records
        self.batch_bytes += t.batch_bytes


@dataclass
class _Window:
    records: int = 0
    bytes: int = 0
    latency_min_ms: int | None = None
    latency_max_ms: int | None = None

    def add(self, records: int, nbytes: int, low: int | None, high: int | None) -> None:
        self.records += records
        self.bytes += nbytes
        if low is not None:
            self.latency_min_ms = low if self.latency_min_ms is None else min(self.latency_min_ms, low)
        if high is not None:
            self.latency_max_ms = high if self.latency_max_ms is None else max(self.latency_max_ms, high)


class StoreCollector(Collector):
    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        configs: dict[str, ConnectorConfig] = {}
        for record in self.store.list_connectors():
            try:
                configs[record.name] = load(record.properties, resolve_references=False)
            except ConnectorConfigError:
                continue  # stored by an older version with different rules; nothing to map topics with
        yield from self._throughput(configs)
        yield from self._connectors(configs)

    def _destination(self, configs: dict[str, ConnectorConfig], connector: str, topic: str) -> str | None:
        config = configs.get(connector)
        return config.namer.destination_topic(topic) if config is not None else None

    def _throughput(self, configs: dict[str, ConnectorConfig]) -> Iterator[Metric]:
        yield from self._totals(configs)
        yield from self._last_window(configs)
        yield from self._lags()

    def _totals(self, configs: dict[str, ConnectorConfig]) -> Iterator[Metric]:
        """Records, bytes and the latency histogram since the start, per connector and destination topic."""
        labels = ["connector", "topic"]
        records = CounterMetricFamily(
            "mirus_replicated_records", "Records replicated and acknowledged by the destination.", labels=labels
        )
        nbytes = CounterMetricFamily(
            "mirus_replicated_bytes", "Key + value bytes replicated and acknowledged.", labels=labels
        )
        latency = HistogramMetricFamily(
            "mirus_replication_latency_seconds",
            "Destination acknowledgement time minus the source record's timestamp "
            "(Mirus replication-latency-ms; buckets include Mirus's 5m/10m/30m/60m/12h).",
            labels=labels,
        )
        resent = CounterMetricFamily(
            "mirus_records_resent",
            "Records written again after a task restart: at least once, those copied after their partition's last "
            "commit before it (0 with start.after.destination.copies).",
            labels=labels,
        )
        batch_records = CounterMetricFamily(
            "mirus_batch_replicated_records",
            "Of mirus_replicated_records_total, the records copied as record batches (copy.mode=batches).",
            labels=labels,
        )
        batch_bytes = CounterMetricFamily(
            "mirus_batch_replicated_bytes",
            "Bytes of the record batches copied as such (record and batch headers included, compressed as written; "
            "counted in mirus_replicated_bytes_total too).",
            labels=labels,
        )
        hand_backs = CounterMetricFamily(
            "mirus_batch_hand_backs",
            "Times the batch path (copy.mode=batches) handed a partition back to the record path, by reason: a batch "
            "that cannot pass (magic, gaps, too_large, partial), the partition paused (paused), or a problem the "
            "batch copier cannot retry (problem).",
            labels=["connector", "reason"],
        )
        totals: dict[tuple[str, str], _Totals] = defaultdict(_Totals)
        reasons: dict[str, Counter[str]] = {
            name: Counter() for name, config in configs.items() if config.copy_mode == "batches"
        }
        for t in self.store.topic_totals():
            destination = self._destination(configs, t.connector, t.topic)
            if destination is not None:
                totals[(t.connector, destination)].add(t)
                if t.batch_records or t.handed_back:  # (a connector that copied batches before, too)
                    reasons.setdefault(t.connector, Counter()).update(t.handed_back)
        for key, total in sorted(totals.items()):
            records.add_metric(list(key), total.records)
            nbytes.add_metric(list(key), total.bytes)
            resent.add_metric(list(key), total.resent)
            buckets = [(_seconds(bound), total.histogram.get(bound, 0)) for bound in BUCKET_LABELS]
            latency.add_metric(list(key), buckets=buckets, sum_value=total.latency_sum_ms / 1000)
            if key[0] in reasons:
                batch_records.add_metric(list(key), total.batch_records)
                batch_bytes.add_metric(list(key), total.batch_bytes)
        for connector, counts in sorted(reasons.items()):
            for reason in HAND_BACK_REASONS:  # every reason, 0 included: increase() sees the first one
                hand_backs.add_metric([connector, reason], counts.get(reason, 0))
        yield records
        yield nbytes
        yield resent
        yield latency
        yield batch_records
        yield batch_bytes
        yield hand_backs

    def _last_window(self, configs: dict[str, ConnectorConfig]) -> Iterator[Metric]:
        """Rates and latency extremes over the last RATE_WINDOW_S, per connector and destination topic."""
        labels = ["connector", "topic"]
        record_rate = GaugeMetricFamily(
            "mirus_record_rate", f"Records per second over the last {RATE_WINDOW_S:.0f} s.", labels=labels
        )
        byte_rate = GaugeMetricFamily(
            "mirus_byte_rate", f"Bytes per second over the last {RATE_WINDOW_S:.0f} s.", labels=labels
        )
        latency_max = GaugeMetricFamily(
            "mirus_replication_latency_max_seconds",
            f"Highest latency over the last {RATE_WINDOW_S:.0f} s (Mirus replication-latency-ms-max).",
            labels=labels,
        )
        latency_min = GaugeMetricFamily(
            "mirus_replication_latency_min_seconds",
            f"Lowest latency over the last {RATE_WINDOW_S:.0f} s (Mirus replication-latency-ms-min).",
            labels=labels,
        )
        recent: dict[tuple[str, str], _Window] = defaultdict(_Window)
        for r in self.store.recent_topics(RATE_WINDOW_S):
            destination = self._destination(configs, r.connector, r.topic)
            if destination is not None:
                recent[(r.connector, destination)].add(r.records, r.bytes, r.latency_min_ms, r.latency_max_ms)
        for key, window in sorted(recent.items()):
            record_rate.add_metric(list(key), window.records / RATE_WINDOW_S)
            byte_rate.add_metric(list(key), window.bytes / RATE_WINDOW_S)
            if window.latency_min_ms is not None and window.latency_max_ms is not None:
                latency_min.add_metric(list(key), window.latency_min_ms / 1000)
                latency_max.add_metric(list(key), window.latency_max_ms / 1000)
        yield record_rate
        yield byte_rate
        yield latency_min
        yield latency_max

    def _lags(self) -> Iterator[Metric]:
        """The latest known lag of each source partition."""
        lag = GaugeMetricFamily(
            "mirus_partition_lag_records",
            "Source records not yet replicated, per source partition (latest known; absent when the source "
            "broker reports no usable high watermark).",
            labels=["connector", "source_topic", "partition"],
        )
        for row in self.store.known_partition_lags():
            lag.add_metric([row.connector, row.topic, str(row.partition)], row.lag)
        yield lag

    def _connectors(self, configs: dict[str, ConnectorConfig]) -> Iterator[Metric]:
        missing = GaugeMetricFamily(
            "mirus_missing_destination_partitions",
            "Selected source partitions whose destination topic or partition does not exist, as of the monitor's "
            "latest look (Mirus missing-dest-partitions-count, here per connector).",
            labels=["connector"],
        )
        tasks = GaugeMetricFamily(
            "mirus_connector_tasks",
            "Tasks per state (Mirus running-/paused-/failed-/unassigned-/destroyed-task-count).",
            labels=["connector", "state"],
        )
        task_restarts = CounterMetricFamily(
            "mirus_task_restart_attempts",
            "Restarts of a failed or silent task (Mirus connector-task-metrics task-failed-restart-attempts-count).",
            labels=["connector", "task"],
        )
        connector_restarts = CounterMetricFamily(
            "mirus_connector_task_restart_attempts",
            "Task restarts summed per connector (Mirus connector-metrics task-failed-restart-attempts-count).",
            labels=["connector"],
        )
        paused = GaugeMetricFamily(
            "mirus_partitions_paused",
            "Source partitions that do not replicate, paused by their task (a refusal, a record too large for its "
            "destination topic: cause record_too_large), by the monitor or by an operator (cause operator); the "
            "reasons are on the connector's status (REST) and the connectors asset.",
            labels=["connector", "cause"],
        )
        task_heartbeat = GaugeMetricFamily(
            "mirus_task_heartbeat_age_seconds",
            "Seconds since the run owning the task last heartbeated its lease (absent while no run holds it); past "
            "task.lease.timeout.ms the task counts as FAILED and the supervisor replaces the run.",
            labels=["connector", "task"],
        )
        flow_heartbeat = GaugeMetricFamily(
            "mirus_flow_heartbeat_age_seconds",
            "Seconds since the newest heartbeat record known to have reached the destination was emitted "
            "(MirrorMaker 2's heartbeats; absent before the first, or with emit.heartbeats.enabled=false).",
            labels=["connector"],
        )
        now = datetime.now(UTC)
        for status in self.store.connector_statuses():
            age = liveness_s(status.heartbeats, status.heartbeats_committed)
            if status.name in configs and age is not None:
                flow_heartbeat.add_metric([status.name], age)
        for connect in administration.connect_statuses(self.store, now=now):
            name, config = connect.name, configs.get(connect.name)
            if config is None:
                continue
            source = self.store.latest_snapshot(name, "source")
            destination = self.store.latest_snapshot(name, "destination")
            if source is not None and source.error is None and destination is not None:
                plan = plan_partitions(config, source.topics, destination.topics)
                missing.add_metric([name], len(plan.missing_destination))
            counts = Counter(t.state for t in connect.tasks)
            for state in TASK_STATES:
                tasks.add_metric([name, state], counts.get(state, 0))
            causes = Counter(p.cause for p in connect.partitions if p.state == PartitionHealth.PAUSED)
            for cause in administration.PAUSE_CAUSES:  # every cause, 0 included: an alert sees it clear
                paused.add_metric([name, cause], causes.get(cause, 0))
            leases = self.store.leases(name)  # tasks no longer assigned too: their restarts still count
            assigned = {t.task_id for t in connect.tasks}
            tasks.add_metric([name, "DESTROYED"], sum(1 for task_id in leases if task_id not in assigned))
            for task_id, lease in sorted(leases.items()):
                task_restarts.add_metric([name, str(task_id)], lease.restart_attempts)
                if lease.state == LEASE_HELD and lease.heartbeat_at is not None:
                    age = max(0.0, (now - lease.heartbeat_at).total_seconds())
                    task_heartbeat.add_metric([name, str(task_id)], age)
            connector_restarts.add_metric([name], sum(lease.restart_attempts for lease in leases.values()))
        yield missing
        yield tasks
        yield task_restarts
        yield connector_restarts
        yield paused
        yield task_heartbeat
        yield flow_heartbeat
