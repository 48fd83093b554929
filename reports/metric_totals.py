"""Replication metrics of every task of every connector: what exporters read.

Tasks write one sample per source topic and interval from whichever process runs them, and in the same transaction
add it to the connector's running totals (`metric_totals`) and overwrite the changed partitions' lags
(`partition_lags`, a row per topic with an element per partition).
Totals cost a scrape one row per series and lags one row per topic, however many samples are kept, and pruning old
samples never lowers a total. Only connectors that still exist are reported.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text

from replicator.state.store import Store


@dataclass(frozen=True)
class TopicTotals:
    """Per connector and source topic, since the connector was created."""

    connector: str
    topic: str
    records: int
    bytes: int
    latency_sum_ms: int
    latency_count: int
    histogram: dict[str, int]  # upper bound in ms ('+Inf') -> records at or below it
    resent: int  # written again after restarts


@dataclass(frozen=True)
class RecentTopic:
    """Per connector and source topic, over the last `window_s` seconds."""

    connector: str
    topic: str
    records: int
    bytes: int
    latency_min_ms: int | None
    latency_max_ms: int | None


@dataclass(frozen=True)
class PartitionLag:
    connector: str
    topic: str
    partition: int
    lag: int


_EXISTING = "connector IN (SELECT name FROM connectors)"


def topic_totals(store: Store) -> list[TopicTotals]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT connector, topic, records, bytes, latency_sum_ms, latency_count, latency_histogram, resent"
                f" FROM metric_totals WHERE {_EXISTING} ORDER BY connector, topic"
            )
        ).all()
    return [
        TopicTotals(c, t, int(r), int(b), int(ls), int(lc), {k: int(v) for k, v in h.items()}, int(rs))
        for c, t, r, b, ls, lc, h, rs in rows
    ]


def recent_topics(store: Store, window_s: float) -> list[RecentTopic]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT connector, topic, sum(records), sum(bytes), min(latency_min_ms), max(latency_max_ms)"
                f" FROM metric_samples WHERE {_EXISTING} AND interval_end > now() - make_interval(secs => :window)"
                " GROUP BY connector, topic ORDER BY connector, topic"
            ),
            {"window": window_s},
        ).all()
    return [RecentTopic(c, t, int(r), int(b), lo, hi) for c, t, r, b, lo, hi in rows]


def partition_lags(store: Store) -> list[PartitionLag]:
    """The latest known lag of every partition (brokers with unusable high watermarks report none)."""
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT l.connector, l.topic, u.n - 1, u.lag"
                " FROM partition_lags l, unnest(l.lags) WITH ORDINALITY AS u(lag, n)"
                f" WHERE u.lag IS NOT NULL AND {_EXISTING} ORDER BY l.connector, l.topic, u.n"
            )
        ).all()
    return [PartitionLag(c, t, p, int(lag)) for c, t, p, lag in rows]
