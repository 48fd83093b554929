"""Metrics: per-topic samples per interval, running totals, and each partition's latest lag."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    func,
    literal_column,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import insert

from replicator.assignment import SourcePartition
from replicator.state.base import StoreBase, array_literal, by_topic_order
from replicator.state.records import MetricInterval, MetricRow
from replicator.state.schema import (
    MetricSample,
    MetricTotal,
    PartitionLag,
)

# Every changed lag of an interval in one statement, a row per topic as `_MERGE_OFFSETS` writes offsets: a
# partition's element is overwritten only by a measurement at least as recent as the stored one, so a report of an
# older interval (an old owner's, late) loses, and two tasks sharing a topic keep each other's partitions. Freshness
# is per partition because tasks' intervals interleave: a per-topic guard would drop a task's lags whenever another
# task sharing the topic had just written a later interval.
_MERGE_LAGS = text("""
INSERT INTO partition_lags AS l (connector, topic, lags, measured_at, updated_at)
SELECT :connector, u.topic, u.lags,
       (SELECT array_agg(CASE WHEN x IS NOT NULL THEN CAST(:measured_at AS timestamptz) END ORDER BY i)
        FROM unnest(u.lags) WITH ORDINALITY AS v(x, i)),
       now()
FROM (SELECT t.topic, CAST(t.lags AS bigint[]) AS lags
      FROM unnest(CAST(:topics AS text[]), CAST(:lags AS text[])) AS t(topic, lags)) AS u
ON CONFLICT (connector, topic) DO UPDATE SET (lags, measured_at, updated_at) = (
  SELECT array_agg(CASE WHEN newer THEN n ELSE s END ORDER BY i),
         array_agg(CASE WHEN newer THEN CAST(:measured_at AS timestamptz) ELSE t END ORDER BY i), now()
  FROM (SELECT s, n, t, i, n IS NOT NULL AND (t IS NULL OR t <= CAST(:measured_at AS timestamptz)) AS newer
        FROM unnest(l.lags, excluded.lags, l.measured_at) WITH ORDINALITY AS m(s, n, t, i)) AS m)
""")


# A running histogram plus a new one, bound by bound (a bound only one side has counts from that side).
HISTOGRAM_SUM = literal_column(
    "(SELECT jsonb_object_agg(k, coalesce((metric_totals.latency_histogram->>k)::bigint, 0)"
    " + coalesce((excluded.latency_histogram->>k)::bigint, 0))"
    " FROM jsonb_object_keys(metric_totals.latency_histogram || excluded.latency_histogram) AS k)"
)


def _add_to_totals(connector: str, samples: Sequence[MetricRow]) -> Any:
    """An upsert adding the samples to their topics' running totals."""
    totals: dict[str, dict[str, Any]] = {}
    for r in samples:
        total = totals.get(r.topic)
        if total is None:
            total = totals[r.topic] = {
                "connector": connector,
                "topic": r.topic,
                "records": 0,
                "bytes": 0,
                "latency_sum_ms": 0,
                "latency_count": 0,
                "latency_histogram": {},
                "resent": 0,
            }
        total["records"] += r.records
        total["bytes"] += r.bytes
        total["latency_sum_ms"] += r.latency_sum_ms
        total["latency_count"] += r.latency_count
        total["resent"] += r.resent
        histogram = total["latency_histogram"]
        for bound, count in r.latency_histogram.items():
            histogram[bound] = histogram.get(bound, 0) + count
    # Rows in a fixed order: two tasks of a connector adding to the same totals then never wait on each other in
    # opposite orders (a deadlock).
    add = insert(MetricTotal).values([totals[t] for t in sorted(totals)])
    return add.on_conflict_do_update(
        index_elements=[MetricTotal.connector, MetricTotal.topic],
        set_={
            "records": MetricTotal.records + add.excluded.records,
            "bytes": MetricTotal.bytes + add.excluded.bytes,
            "latency_sum_ms": MetricTotal.latency_sum_ms + add.excluded.latency_sum_ms,
            "latency_count": MetricTotal.latency_count + add.excluded.latency_count,
            "latency_histogram": HISTOGRAM_SUM,
            "resent": MetricTotal.resent + add.excluded.resent,
            "updated_at": func.now(),
        },
    )


class MetricStore(StoreBase):
    def record_metrics(self, connector: str, interval: MetricInterval) -> None:
        """Store the samples, add them to the connector's running totals and overwrite the changed partitions' lags,
        in one transaction (so a total never counts a sample twice or misses one): three statements, whatever the
        number of partitions, each writing a row per topic."""
        if not interval.samples and not interval.lags:
            return
        with self.engine.begin() as conn:
            if interval.samples:
                # One statement compiled once and cached, its rows sent in batches (executemany): a multi-row
                # VALUES statement built per call costs Python ~0.5 ms a row to compile.
                conn.execute(insert(MetricSample), [{"connector": connector, **r.__dict__} for r in interval.samples])
                conn.execute(_add_to_totals(connector, interval.samples))
            if interval.lags:
                by_topic = by_topic_order(interval.lags)
                conn.execute(
                    _MERGE_LAGS,
                    {
                        "connector": connector,
                        "measured_at": interval.measured_at,
                        "topics": list(by_topic),
                        "lags": [array_literal(lags) for lags in by_topic.values()],
                    },
                )

    def partition_lags(self, connector: str) -> dict[SourcePartition, int | None]:
        """Each measured source partition's latest lag (None where the broker gave no usable end)."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(PartitionLag.topic, PartitionLag.lags, PartitionLag.measured_at).where(
                    PartitionLag.connector == connector
                )
            )
            return {
                (topic, partition): lag
                for topic, lags, measured in rows
                for partition, (lag, at) in enumerate(zip(lags, measured, strict=True))
                if at is not None
            }

    def metric_samples(self, connector: str) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(MetricSample).where(MetricSample.connector == connector).order_by(MetricSample.id)
            )
            return [dict(r._mapping) for r in rows]
