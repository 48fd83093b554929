"""The latency histogram of a task's metrics: folded in bulk, it counts every record where a per-record count would."""

from __future__ import annotations

import random
from bisect import bisect_left

from replicator.metrics import BUCKET_LABELS, LATENCY_BUCKETS_MS, PartitionCounters


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
        "min": max(min(latencies), 0), "max": max(max(latencies), 0), "count": len(latencies),
        "sum": sum(latency for latency in latencies if latency > 0), "histogram": cumulative,
    }  # fmt: skip


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
    counters = PartitionCounters()
    for acked, timestamps in acknowledgements:
        counters.add_latencies(acked, list(timestamps))

    expected = _one_by_one(acknowledgements)
    assert counters.cumulative_histogram() == expected["histogram"]
    assert (counters.latency_min, counters.latency_max) == (expected["min"], expected["max"])
    assert (counters.latency_count, counters.latency_sum) == (expected["count"], expected["sum"])
    assert counters.cumulative_histogram()["10"] > 0 and counters.buckets[-1] > 0  # both ends were exercised


def test_counters_merged_say_what_one_counter_of_everything_says() -> None:
    now = 1_795_000_000_000
    runs = [(now, [now - 3, now - 30]), (now + 7, [now - 700, now + 9]), (now, [now - 20_000_000])]
    whole, parts = PartitionCounters(), [PartitionCounters() for _ in runs]
    for part, (acked, timestamps) in zip(parts, runs, strict=True):
        whole.add(len(timestamps), 10 * len(timestamps))
        whole.add_latencies(acked, timestamps)
        part.add(len(timestamps), 10 * len(timestamps))
        part.add_latencies(acked, timestamps)
    merged = PartitionCounters()
    for part in [PartitionCounters(), *parts]:  # an empty one (a partition with no records) changes nothing
        merged.merge(part)
    fields = ("records", "bytes", "latency_min", "latency_max", "latency_sum", "latency_count", "buckets")
    assert [getattr(merged, f) for f in fields] == [getattr(whole, f) for f in fields]
    assert (merged.latency_min, merged.latency_max, merged.records) == (0, 20_000_000, 5)
