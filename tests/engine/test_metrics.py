"""A task's metrics: the latency histogram, folded in bulk, counts every record where a per-record count would;
an interval is drained as one sample per topic and the partitions whose lag changed."""

from __future__ import annotations

import random
from bisect import bisect_left

from replicator.engine.metrics import BUCKET_LABELS, LATENCY_BUCKETS_MS, TaskMetrics, TopicCounters


def _one_by_one(acknowledgements: list[tuple[int, list[int]]]) -> dict[str, object]:
    """What the histogram must say: each latency, clamped at 0, in the first bucket whose bound it is within."""
    latencies = [now - ts for now, timestamps in acknowledgements for ts in timestamps]
    buckets = [0] * len(BUCKET_LABELS)
    for latency in latencies:
        buckets[bisect_left(LATENCY_BUCKETS_MS, latency)] += 1
    cumulative, total = {}, 0
    for label, count in zip(BUCKET_LABELS, buckets, strict=True):
        total += count
        cumulative[label] = total
    return {
        "min": max(min(latencies), 0),
        "max": max(max(latencies), 0),
        "count": len(latencies),
        "sum": sum(latency for latency in latencies if latency > 0),
        "histogram": cumulative,
    }


def test_runs_folded_in_bulk_count_every_record_in_its_bucket() -> None:
    rng = random.Random(20261122)
    now = 1_795_000_000_000
    bounds = [now - b for b in LATENCY_BUCKETS_MS]
    acknowledgements = [
        (now, [now - 10, now - 11, now - 9, now]),  # exactly on a bound, and zero
        (now, [now + 3, now + 1, now - 1]),  # a source clock ahead of the destination's: negative latencies
        (now + 5, bounds + [b - 1 for b in bounds] + [b + 1 for b in bounds]),  # around every bound, unsorted
        (now, [now - 50_000_000]),  # beyond the last bound: +Inf
    ]
    for _ in range(200):  # runs as the task sees them: mostly ascending CreateTime, sometimes out of order
        acked = now + rng.randrange(0, 60_000)
        start = acked - rng.choice([5, 40, 400, 4_000, 400_000, 40_000_000])
        timestamps = sorted(start + rng.randrange(0, 1_000) for _ in range(rng.randrange(1, 300)))
        if rng.random() < 0.3:
            rng.shuffle(timestamps)
        acknowledgements.append((acked, timestamps))
    counters = TopicCounters()
    for acked, timestamps in acknowledgements:
        counters.add_latencies(acked, list(timestamps))

    expected = _one_by_one(acknowledgements)
    assert counters.cumulative_histogram() == expected["histogram"]
    assert (counters.latency_min, counters.latency_max) == (expected["min"], expected["max"])
    assert (counters.latency_count, counters.latency_sum) == (expected["count"], expected["sum"])
    assert counters.cumulative_histogram()["10"] > 0 and counters.buckets[-1] > 0  # both ends were exercised


def test_an_interval_is_one_sample_per_topic_and_the_partitions_whose_lag_changed() -> None:
    metrics = TaskMetrics(3)
    now = 1_795_000_000_000
    for _partition in range(100):  # every partition's acknowledgements land in its topic's counters
        metrics.counters_for("orders").add(2, 20)
        metrics.counters_for("orders").add_latencies(now, [now - 40, now - 4_000])
    first = metrics.drain({("orders", p): p for p in range(100)} | {("idle", 0): 5, ("idle", 1): None})
    orders, idle = sorted(first.samples, key=lambda s: s.topic, reverse=True)
    assert (orders.task_id, orders.topic, orders.records, orders.bytes) == (3, "orders", 200, 2_000)
    assert orders.latency_count == orders.latency_histogram["+Inf"] == 200
    assert (orders.latency_histogram["50"], orders.latency_histogram["5000"]) == (100, 200)
    assert (orders.latency_min_ms, orders.latency_max_ms, orders.lag) == (40, 4_000, sum(range(100)))
    assert (idle.records, idle.latency_count, idle.latency_min_ms, idle.lag) == (0, 0, None, 5)
    assert len(first.lags) == 101 and ("idle", 1) not in first.lags  # an unknown lag is not written

    second = metrics.drain({("orders", p): p for p in range(100)} | {("orders", 7): 70, ("idle", 0): 5})
    (moved,) = second.samples  # nothing replicated; one partition's lag changed, so its topic has a sample
    assert (moved.topic, moved.records, moved.lag, dict(second.lags)) == (
        "orders",
        0,
        sum(range(100)) + 63,
        {("orders", 7): 70},
    )
    assert moved.interval_start == first.measured_at == orders.interval_end
    assert not metrics.drain({("orders", p): p for p in range(100)} | {("orders", 7): 70}).samples
