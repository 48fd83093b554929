"""What a Prometheus scrape of `/metrics` costs as the metric sample table grows: the running totals the exporter
reads now, against the sums over every stored sample it computed before (commit 70a1123 and earlier).

    python benchmarks/scrape_cost.py [--partitions 1000] [--every-s 60] [--hours 6,12,24] [--rounds 5]

Fills `metric_samples` for one connector of `--partitions` partitions in 10 topics, one sample per topic every
`--every-s` seconds (as tasks write them: per topic, since migration 0006), growing to each of `--hours` in turn,
with the totals and the partitions' lags the tasks keep beside them (as
`Store.record_metrics` writes them, computed in one statement per step so that the fill takes seconds). At each
size it times, alternating over `--rounds`, the whole scrape (`StoreCollector.collect`) and the previous
exporter's queries over the samples, and prints medians. Uses `MIRUS_DATABASE_URL` when set, else a private
embedded Postgres on free ports.
"""

from __future__ import annotations

import argparse
import statistics
import time

import common
from sqlalchemy import Engine, text

from mirus.api.metrics import StoreCollector
from replicator.state.database import upgrade
from replicator.state.store import Store

CONNECTOR = "scrape-bench"
TOPICS = 10

# The exporter's queries before the running totals: every counter summed over every stored sample (the newest lag
# now per topic, samples having no partition since migration 0006).
PREVIOUS_SCRAPE = (
    "SELECT connector, topic, sum(records), sum(bytes), sum(latency_sum_ms), sum(latency_count)"
    " FROM metric_samples WHERE connector IN (SELECT name FROM connectors) GROUP BY connector, topic",
    "SELECT connector, topic, h.key, sum(h.value::bigint) FROM metric_samples, jsonb_each_text(latency_histogram)"
    " AS h WHERE connector IN (SELECT name FROM connectors) GROUP BY connector, topic, h.key",
    "SELECT DISTINCT ON (connector, topic) connector, topic, lag FROM metric_samples"
    " WHERE lag IS NOT NULL AND connector IN (SELECT name FROM connectors) ORDER BY connector, topic, id DESC",
)

HISTOGRAM = (
    '{"5": 1, "10": 2, "25": 3, "50": 4, "100": 5, "250": 6, "500": 6, "1000": 6, "10000": 6, "60000": 6,'
    ' "300000": 6, "600000": 6, "1800000": 6, "3600000": 6, "43200000": 6, "+Inf": 6}'
)


def fill_samples(engine: Engine, partitions: int, every_s: int, from_s: int, to_s: int) -> None:
    """Samples for intervals ending `to_s` .. `from_s` seconds ago (exclusive), and the totals and lags for them."""
    per_topic = partitions // TOPICS
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO metric_samples (connector, task_id, topic, interval_start, interval_end, records, bytes,"
                " latency_min_ms, latency_max_ms, latency_sum_ms, latency_count, latency_histogram, lag)"
                " SELECT :c, 0, 'topic-' || g, now() - make_interval(secs => s + 10), now() - make_interval(secs => s),"
                " 6 * :per, 600 * :per, 3, 2000, 3000 * :per, 6 * :per, CAST(:h AS jsonb), 0"
                " FROM generate_series(0, 9) AS g, generate_series(:lo, :hi, :step) AS s"
            ),
            {"c": CONNECTOR, "per": per_topic, "h": HISTOGRAM, "lo": to_s, "hi": from_s - 1, "step": every_s},
        )
        conn.execute(
            text(
                "INSERT INTO metric_totals AS t (connector, topic, records, bytes, latency_sum_ms, latency_count,"
                " latency_histogram)"
                " SELECT :c, 'topic-' || g, :r, :r * 100, :r * 500, :r, CAST(:h AS jsonb)"
                " FROM generate_series(0, 9) AS g"
                " ON CONFLICT (connector, topic) DO UPDATE SET records = t.records + excluded.records,"
                " bytes = t.bytes + excluded.bytes, latency_sum_ms = t.latency_sum_ms + excluded.latency_sum_ms,"
                " latency_count = t.latency_count + excluded.latency_count"
            ),
            {"c": CONNECTOR, "r": 6 * per_topic * len(range(to_s, from_s, every_s)), "h": HISTOGRAM},
        )
        conn.execute(
            text(
                "INSERT INTO partition_lags (connector, topic, lags, measured_at)"
                " SELECT :c, 'topic-' || g, array_fill(0::bigint, ARRAY[:per]), array_fill(now(), ARRAY[:per])"
                " FROM generate_series(0, :n / :per - 1) AS g ON CONFLICT DO NOTHING"
            ),
            {"c": CONNECTOR, "per": per_topic, "n": partitions},
        )
        conn.execute(text("ANALYZE metric_samples"))


def timed_scrape(store: Store) -> float:
    started = time.perf_counter()
    families = list(StoreCollector(store).collect())
    elapsed = time.perf_counter() - started
    assert any(f.name == "mirus_replicated_records" and f.samples for f in families), "nothing scraped"
    return elapsed


def timed_previous(engine: Engine) -> float:
    started = time.perf_counter()
    with engine.connect() as conn:
        for query in PREVIOUS_SCRAPE:
            conn.execute(text(query)).all()
    return time.perf_counter() - started


def run(engine: Engine, partitions: int, every_s: int, hours: list[float], rounds: int) -> None:
    upgrade(engine)
    store = Store(engine)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM metric_samples WHERE connector = :c"), {"c": CONNECTOR})
        conn.execute(text("DELETE FROM metric_totals WHERE connector = :c"), {"c": CONNECTOR})
        conn.execute(text("DELETE FROM partition_lags WHERE connector = :c"), {"c": CONNECTOR})
    topics = ",".join(f"topic-{g}" for g in range(TOPICS))
    store.put_connector(
        CONNECTOR,
        {
            "name": CONNECTOR,
            "topics.whitelist": topics,
            "consumer.bootstrap.servers": "127.0.0.1:1",
            "destination.consumer.bootstrap.servers": "127.0.0.1:2",
        },
        1,
    )
    print(f"{partitions:,} partitions in {TOPICS} topics, a sample per topic every {every_s} s")
    print(f"{'hours kept':>10} {'samples':>12} {'scrape now (ms)':>16} {'previous queries (ms)':>22}")
    filled_s = 0
    for h in hours:
        fill_samples(engine, partitions, every_s, int(h * 3600), filled_s)
        filled_s = int(h * 3600)
        with engine.connect() as conn:
            samples = conn.execute(text("SELECT count(*) FROM metric_samples")).scalar_one()
        now: list[float] = []
        before: list[float] = []
        timed_scrape(store)  # warm the connection pool and caches alike for both
        timed_previous(engine)
        for i in range(rounds):  # alternating which goes first
            for which in ("now", "before") if i % 2 == 0 else ("before", "now"):
                if which == "now":
                    now.append(timed_scrape(store))
                else:
                    before.append(timed_previous(engine))
        print(
            f"{h:>10g} {samples:>12,} {statistics.median(now) * 1000:>16.1f} {statistics.median(before) * 1000:>22.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--every-s", type=int, default=60)
    parser.add_argument("--hours", default="6,12,24")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    hours = [float(h) for h in args.hours.split(",")]
    with common.platform_database() as store:
        run(store.engine, args.partitions, args.every_s, hours, args.rounds)


if __name__ == "__main__":
    main()
