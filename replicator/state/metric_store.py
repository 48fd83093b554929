"""Metrics: per-topic samples per interval, running totals, and each partition's latest lag.

Tasks write one sample per source topic and interval from whichever process runs them, and in the same transaction
add it to the connector's running totals (`metric_totals`) and overwrite the changed partitions' lags
(`partition_lags`, a row per topic with an element per partition). What exporters read (`topic_totals`,
`recent_topics`, `known_partition_lags`) costs a scrape one row per series for totals and one row per topic for lags,
however many samples are kept, and pruning old samples (after the lake exported them) never lowers a total. Exporters
are shown only connectors that still exist.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    ColumnClause,
    ColumnElement,
    func,
    literal_column,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import insert

from replicator.assignment import SourcePartition
from replicator.state.base import StoreBase, array_literal, by_topic_order
from replicator.state.records import MetricInterval, MetricRow, PartitionLagRow, RecentTopic, TopicTotals
from replicator.state.schema import (
    Connector,
    MetricSample,
    MetricTotal,
    TopicLags,
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


def _counts_sum(column: str) -> ColumnClause[Any]:
    """A running JSONB object of counts plus a new one, key by key (a key only one side has counts from that side;
    two empty objects stay empty)."""
    return literal_column(
        f"(SELECT coalesce(jsonb_object_agg(k, coalesce((metric_totals.{column}->>k)::bigint, 0)"
        f" + coalesce((excluded.{column}->>k)::bigint, 0)), '{{}}'::jsonb)"
        f" FROM jsonb_object_keys(metric_totals.{column} || excluded.{column}) AS k)"
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
                "batch_records": 0,
                "batch_bytes": 0,
                "handed_back": {},
            }
        total["records"] += r.records
        total["bytes"] += r.bytes
        total["latency_sum_ms"] += r.latency_sum_ms
        total["latency_count"] += r.latency_count
        total["resent"] += r.resent
        total["batch_records"] += r.batch_records
        total["batch_bytes"] += r.batch_bytes
        for key, counts in (("latency_histogram", r.latency_histogram), ("handed_back", r.handed_back)):
            summed = total[key]
            for name, count in counts.items():
                summed[name] = summed.get(name, 0) + count
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
            "latency_histogram": _counts_sum("latency_histogram"),
            "resent": MetricTotal.resent + add.excluded.resent,
            "batch_records": MetricTotal.batch_records + add.excluded.batch_records,
            "batch_bytes": MetricTotal.batch_bytes + add.excluded.batch_bytes,
            "handed_back": _counts_sum("handed_back"),
            "updated_at": func.now(),
        },
    )


_EXISTING = "connector IN (SELECT name FROM connectors)"


def _cumulative_buckets(bounds: Sequence[str]) -> str:
    """Cumulative bucket counts out of the JSONB histogram, a column `le_<bound>` each (`le_inf` for +Inf). A bound
    the row lacks (written with fewer buckets) takes the count of the nearest lower bound it has: still a true "at or
    below" count."""
    columns = []
    for i, label in enumerate(bounds):
        fallbacks = ", ".join(f"(latency_histogram->>'{lower}')::bigint" for lower in reversed(bounds[:i]))
        own = f"(latency_histogram->>'{label}')::bigint"
        column = "le_inf" if label == "+Inf" else f"le_{label}"
        columns.append(f"COALESCE({own}, {fallbacks + ', ' if fallbacks else ''}0) AS {column}")
    return ", ".join(columns)


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
                # VALUES statement built per call costs Python far more per row to compile.
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
        return {(t, p): lag for _, t, p, lag in self._measured_lags(TopicLags.connector == connector)}

    def known_partition_lags(self) -> list[PartitionLagRow]:
        """The latest known lag of every partition of every connector (brokers with unusable high watermarks report
        none), by connector, topic and partition."""
        measured = self._measured_lags(TopicLags.connector.in_(select(Connector.name)))
        return [PartitionLagRow(c, t, p, lag) for c, t, p, lag in measured if lag is not None]

    def _measured_lags(self, where: ColumnElement[bool]) -> list[tuple[str, str, int, int | None]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(TopicLags.connector, TopicLags.topic, TopicLags.lags, TopicLags.measured_at)
                .where(where)
                .order_by(TopicLags.connector, TopicLags.topic)
            )
            return [
                (connector, topic, partition, lag)
                for connector, topic, lags, measured in rows
                for partition, (lag, at) in enumerate(zip(lags, measured, strict=True))
                if at is not None
            ]

    def topic_totals(self) -> list[TopicTotals]:
        """Every connector's running totals, per source topic."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT connector, topic, records, bytes, latency_sum_ms, latency_count, latency_histogram, resent,"
                    " batch_records, batch_bytes, handed_back"
                    f" FROM metric_totals WHERE {_EXISTING} ORDER BY connector, topic"
                )
            ).all()
        return [
            TopicTotals(
                c, t, int(r), int(b), int(ls), int(lc), {k: int(v) for k, v in h.items()}, int(rs), int(br), int(bb),
                {k: int(v) for k, v in hb.items()},
            )
            for c, t, r, b, ls, lc, h, rs, br, bb, hb in rows
        ]  # fmt: skip

    def recent_topics(self, window_s: float) -> list[RecentTopic]:
        """Every connector's samples of the last `window_s` seconds, summed per source topic."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT connector, topic, sum(records), sum(bytes), min(latency_min_ms), max(latency_max_ms)"
                    f" FROM metric_samples WHERE {_EXISTING} AND interval_end > now() - make_interval(secs => :window)"
                    " GROUP BY connector, topic ORDER BY connector, topic"
                ),
                {"window": window_s},
            ).all()
        return [RecentTopic(c, t, int(r), int(b), lo, hi) for c, t, r, b, lo, hi in rows]

    def metric_samples(self, connector: str) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(MetricSample).where(MetricSample.connector == connector).order_by(MetricSample.id)
            )
            return [dict(r._mapping) for r in rows]

    def metric_sample_columns(
        self, start: datetime, end: datetime, after: int, bounds: Sequence[str], rows: int
    ) -> Iterator[dict[str, tuple[Any, ...]]]:
        """The samples whose interval ended in [start, end) with an id above `after`, by id, streamed `rows` at a
        time, each chunk as columns by name; the histogram as cumulative counts at `bounds` (`_cumulative_buckets`)."""
        query = text(
            "SELECT id, connector, task_id, topic, interval_start, interval_end, records, bytes, latency_min_ms,"
            " latency_max_ms, latency_sum_ms, latency_count, lag, "
            + _cumulative_buckets(bounds)
            + " FROM metric_samples WHERE interval_end >= :start AND interval_end < :end AND id > :after ORDER BY id"
        )
        with self.engine.connect().execution_options(stream_results=True) as conn:
            result = conn.execute(query, {"start": start, "end": end, "after": after})
            names = list(result.keys())
            while chunk := result.fetchmany(rows):
                yield dict(zip(names, zip(*chunk, strict=True), strict=True))

    def metric_sample_hours(self, before: datetime) -> list[datetime]:
        """The hours (UTC) of the samples whose interval ended before `before`."""
        with self.engine.connect() as conn:
            hours = conn.scalars(
                text(
                    "SELECT DISTINCT date_trunc('hour', interval_end AT TIME ZONE 'UTC') FROM metric_samples"
                    " WHERE interval_end < :cutoff"
                ),
                {"cutoff": before},
            )
            return [h.replace(tzinfo=UTC) for h in hours]

    def delete_metric_samples(self, before: datetime, hours: Sequence[datetime]) -> int:
        """Delete the samples whose interval ended before `before` in `hours` (UTC); returns how many."""
        with self.engine.begin() as conn:
            return conn.execute(
                text(
                    "DELETE FROM metric_samples WHERE interval_end < :cutoff"
                    " AND date_trunc('hour', interval_end AT TIME ZONE 'UTC') = ANY(:hours)"
                ),
                {"cutoff": before, "hours": [h.astimezone(UTC).replace(tzinfo=None) for h in hours]},
            ).rowcount

    def count_metric_samples(self) -> int:
        with self.engine.connect() as conn:
            count: int = conn.execute(text("SELECT count(*) FROM metric_samples")).scalar_one()
            return count
