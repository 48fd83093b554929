"""Replication metrics, accumulated per source topic in memory and written to Postgres per interval.

Samples are per topic, not per partition, so that metric storage grows with topics: a task holding 10,000
partitions of ten topics writes ten sample rows an interval. Lag stays per partition, as the latest value
(`MetricInterval.lags`, overwritten in `partition_lags`).

Records copied as record batches (`copy.mode=batches`) count in the topic's records and bytes, and again apart
(`batch_records`, `batch_bytes`); the batch path's hand-backs to the record path are counted per reason as they
happen, never per record.

Latency is the destination's acknowledgement time minus the source record's timestamp (as Mirus and MirrorMaker
2 define it). The histogram's upper bounds include Mirus's buckets (5m, 10m, 30m, 60m, 12h; its "0m" bucket is
everything below the first bound) with finer ones, about 2.5x apart, below a minute where a healthy replicator
lives: reports estimate percentiles by interpolating inside a bucket, so a bucket's width bounds the error.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from datetime import UTC, datetime

from replicator.assignment import SourcePartition
from replicator.batches.record_batch import Reason
from replicator.state.records import MetricInterval, MetricRow

# Why the batch path handed a partition back to the record path (`copy.mode=batches`), as /metrics labels it: a
# batch that cannot pass (`Reason`), the partition paused or held, or a problem the copier cannot retry.
PAUSED, PROBLEM = "paused", "problem"
HAND_BACK_REASONS = (*(reason.name.lower() for reason in Reason), PAUSED, PROBLEM)

LATENCY_BUCKETS_MS: tuple[int, ...] = (
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000,
    300_000, 600_000, 1_800_000, 3_600_000, 43_200_000,
)  # fmt: skip
MIRUS_BUCKETS_MS: tuple[int, ...] = (300_000, 600_000, 1_800_000, 3_600_000, 43_200_000)  # 5m 10m 30m 60m 12h
BUCKET_LABELS: tuple[str, ...] = (*(str(b) for b in LATENCY_BUCKETS_MS), "+Inf")


class TopicCounters:
    """What one source topic replicated since the last drain."""

    __slots__ = (
        "batch_bytes", "batch_records", "buckets", "bytes", "handed_back", "latency_count", "latency_max",
        "latency_min", "latency_sum", "records", "resent",
    )  # fmt: skip

    def __init__(self) -> None:
        self.records = 0
        self.bytes = 0
        self.latency_min: int | None = None
        self.latency_max: int | None = None
        self.latency_sum = 0
        self.latency_count = 0
        self.buckets = [0] * len(BUCKET_LABELS)
        self.resent = 0  # records a start found already copied after their last commit, written again
        self.batch_records = 0  # of `records`, those copied as record batches
        self.batch_bytes = 0
        self.handed_back: dict[str, int] = {}  # the batch path's hand-backs to the record path, by reason

    def add(self, records: int, nbytes: int) -> None:
        """Fold `records` acknowledged records of `nbytes`."""
        self.records += records
        self.bytes += nbytes

    def add_batches(self, records: int, nbytes: int) -> None:
        """Fold `records` records copied as record batches of `nbytes` (counted in `records` and `bytes` too)."""
        self.add(records, nbytes)
        self.batch_records += records
        self.batch_bytes += nbytes

    def hand_back(self, reason: str) -> None:
        """Count a partition the batch path handed back to the record path for `reason`."""
        self.handed_back[reason] = self.handed_back.get(reason, 0) + 1

    def add_latencies(self, acknowledged_ms: int, timestamps: list[int]) -> None:
        """Fold the latencies of records acknowledged together at `acknowledged_ms`, from their source timestamps
        (ms since the epoch). Sorted once, the timestamps give every bucket's count by bisection: the work per
        record is C's (sorting nearly sorted data, summing), not a Python loop's, so a fold of a busy second does
        not stall the task."""
        if not timestamps:
            return
        ts = sorted(timestamps)
        n, now = len(ts), acknowledged_ms
        # Clocks of two clusters are never perfectly in step: a negative latency counts as 0.
        self._widen(max(now - ts[-1], 0), max(now - ts[0], 0))
        past = bisect_left(ts, now)  # records with a positive latency
        self.latency_sum += past * now - (sum(ts) if past == n else sum(ts[:past]))
        self.latency_count += n
        buckets, counted = self.buckets, 0
        for i, bound in enumerate(LATENCY_BUCKETS_MS):  # latency <= bound  <=>  timestamp >= now - bound
            within = n - bisect_left(ts, now - bound)
            buckets[i] += within - counted
            counted = within
            if counted == n:
                return
        buckets[-1] += n - counted

    def add_batch_latencies(self, acknowledged_ms: int, batches: Iterable[tuple[int, int]]) -> None:
        """Fold the records of batches acknowledged at `acknowledged_ms`, given as (timestamp, records): each record
        counted at its batch's timestamp (its records are not decoded: `replicator.engine.batch_lanes` says which
        timestamp)."""
        buckets, low, high = self.buckets, None, None
        for timestamp, records in batches:
            latency = max(acknowledged_ms - timestamp, 0)
            low = latency if low is None else min(low, latency)
            high = latency if high is None else max(high, latency)
            self.latency_sum += latency * records
            self.latency_count += records
            buckets[bisect_left(LATENCY_BUCKETS_MS, latency)] += records
        if low is not None and high is not None:
            self._widen(low, high)

    def _widen(self, low: int, high: int) -> None:
        self.latency_min = low if self.latency_min is None else min(self.latency_min, low)
        self.latency_max = high if self.latency_max is None else max(self.latency_max, high)

    def cumulative_histogram(self) -> dict[str, int]:
        """Count of records at or below each upper bound (Prometheus-style), '+Inf' last."""
        total, out = 0, {}
        for label, count in zip(BUCKET_LABELS, self.buckets, strict=True):
            total += count
            out[label] = total
        return out


class TaskMetrics:
    """Per-topic counters and per-partition lags of one task, turned into a `MetricInterval` every interval."""

    def __init__(self, task_id: int, interval_s: float = 10.0) -> None:
        self.task_id = task_id
        self.interval_s = interval_s
        self.interval_start = datetime.now(UTC)
        self.counters: dict[str, TopicCounters] = {}
        self.reported_lags: dict[SourcePartition, int | None] = {}  # each partition's lag as last written

    def counters_for(self, topic: str) -> TopicCounters:
        counters = self.counters.get(topic)
        if counters is None:
            counters = self.counters[topic] = TopicCounters()
        return counters

    def drain(self, lags: dict[SourcePartition, int | None] | None) -> MetricInterval:
        """A sample for every topic that moved records or had a partition's known lag change, and the partitions
        whose lag changed; counters start again at zero. `lags` None: unchanged since the last interval.

        A sample's lag is the sum of the known lags of this task's partitions of its topic (None when none is
        known). What neither moved nor changed its lag writes nothing: an idle task holding thousands of partitions
        costs Postgres nothing but its heartbeat (its last lags stay in `partition_lags`)."""
        end = datetime.now(UTC)
        if lags is None:
            lags, changed = self.reported_lags, {}
        else:
            changed = {p: lag for p, lag in lags.items() if lag is not None and self.reported_lags.get(p) != lag}
        topics = set(self.counters) | {topic for topic, _ in changed}
        topic_lags: dict[str, int | None] = dict.fromkeys(topics)
        if topics:
            for (topic, _), lag in lags.items():
                if lag is not None and topic in topic_lags:
                    topic_lags[topic] = (topic_lags[topic] or 0) + lag
        samples = []
        for topic in sorted(topics):
            c = self.counters.get(topic) or TopicCounters()
            samples.append(
                MetricRow(
                    task_id=self.task_id,
                    topic=topic,
                    interval_start=self.interval_start,
                    interval_end=end,
                    records=c.records,
                    bytes=c.bytes,
                    latency_min_ms=c.latency_min,
                    latency_max_ms=c.latency_max,
                    latency_sum_ms=c.latency_sum,
                    latency_count=c.latency_count,
                    latency_histogram=c.cumulative_histogram(),
                    lag=topic_lags[topic],
                    resent=c.resent,
                    batch_records=c.batch_records,
                    batch_bytes=c.batch_bytes,
                    handed_back=c.handed_back,
                )
            )
        self.counters = {}
        self.interval_start = end
        self.reported_lags = lags
        return MetricInterval(samples, changed, end)
