"""Control-plane costs for capacity planning: Postgres per commit and metric batch, the monitor per 10,000
partitions, the run_starter sensor's tick per connector, and a replicator task's memory.

    python benchmarks/control_plane.py [--partitions 10000] [--connectors 1,10,50]

Starts a private embedded stack on free ports (or uses MIRUS_SOURCE_BOOTSTRAP_SERVERS /
MIRUS_DESTINATION_BOOTSTRAP_SERVERS / MIRUS_DATABASE_URL). Figures are medians of repeated calls.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import apache_kafka as kit
import common
import psutil
from sqlalchemy import text

from mirus_dagster.settings import StackEndpoints
from replicator.configuration.connector import ConnectorConfig, validate_submission
from replicator.discovery.monitor import KafkaMonitor
from replicator.engine.metrics import BUCKET_LABELS
from replicator.state.database import make_engine, upgrade
from replicator.state.records import ConnectorState, MetricInterval, MetricRow
from replicator.state.store import Store


def median_ms(fn: Callable[[int], object], repeat: int) -> float:
    times = []
    for i in range(repeat):
        start = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def timed(fn: Callable[[int], object], repeat: int, pid: int | None) -> str:
    """Median wall time of one call (client included) and the Postgres server's CPU per call."""
    server = common.tree(psutil.Process(pid)) if pid else []  # the postmaster and every backend
    before = common.cpu_s(server)
    ms = median_ms(fn, repeat)
    if not pid:
        return f"{ms:7.2f} ms"
    server_ms = (common.cpu_s(server) - before) / repeat * 1000
    return f"{ms:7.2f} ms wall, {server_ms:6.2f} ms Postgres CPU"


def connector(store: Store, ep: StackEndpoints, name: str, regex: str, tasks: int) -> ConnectorConfig:
    config = validate_submission(
        {
            "name": name,
            "tasks.max": tasks,
            "topics.regex": regex,
            "destination.topic.name.suffix": ".mirror",
            "consumer.bootstrap.servers": ep.source_bootstrap_servers,
            "destination.consumer.bootstrap.servers": ep.destination_bootstrap_servers,
        }
    )
    store.put_connector(name, config.raw, config.tasks_max)
    return config


def postgres_costs(store: Store, pid: int | None) -> None:
    print("Postgres, one task's writes (Store.commit = lease heartbeat + offsets, one transaction):")
    tag = f"pg{int(time.time())}"
    store.put_connector(tag, {"name": tag}, 1)
    store.write_assignment(tag, {0: []})
    lease = store.claim_task(tag, 0, "benchmark")
    for partitions in (0, 1, 10, 100, 1000):
        figures = timed(lambda i, n=partitions: store.commit(lease, {(tag, p): i + 1 for p in range(n)}), 40, pid)
        print(f"  commit with {partitions:>4} changed partitions: {figures}")
    now = datetime.now(UTC)
    histogram = {label: 0 for label in BUCKET_LABELS}
    samples = [MetricRow(0, f"{tag}-{t}", now, now, 1000, 100_000, 1, 50, 5000, 1000, histogram, 0) for t in range(20)]
    for partitions in (20, 1000, 10_000):
        lags = {(f"{tag}-{p % 20}", p // 20): 1 for p in range(partitions)}
        figures = timed(
            lambda i, n=lags: store.record_metrics(tag, MetricInterval(samples, {tp: i for tp in n}, now)), 10, pid
        )
        print(f"  metric interval of 20 topics, {partitions:>5} changed partition lags: {figures}")
    store.delete_connector(tag)


def monitor_costs(store: Store, ep: StackEndpoints, total: int) -> None:
    per_topic = 100
    topics = [f"cap{int(time.time())}-{i:04d}" for i in range(max(total // per_topic, 1))]
    print(f"Monitor: {len(topics)} topics x {per_topic} partitions = {len(topics) * per_topic:,} partitions")
    start = time.perf_counter()
    common.create_topics(ep.source_bootstrap_servers, dict.fromkeys(topics, per_topic), batch=50)
    common.create_topics(ep.destination_bootstrap_servers, {f"{t}.mirror": per_topic for t in topics}, batch=50)
    print(f"  (created both sides in {time.perf_counter() - start:.1f} s)")
    prefix = topics[0].rsplit("-", 1)[0]
    name = f"{prefix}-conn"
    connector(store, ep, name, f"{prefix}-.*", 100)
    monitor = KafkaMonitor(store)
    first = time.perf_counter()
    result = monitor.poll(name)
    first = (time.perf_counter() - first) * 1000
    assigned = sum(len(p) for p in result.tasks.values())
    print(f"  first poll (generation {result.generation}, {assigned:,} partitions over 100 tasks): {first:.0f} ms")
    steady = median_ms(lambda _i: monitor.poll(name), 5)
    print(f"  steady poll (nothing changed): {steady:.0f} ms")
    store.set_connector_state(name, ConnectorState.PAUSED)  # the sensor figures below are per connector of their own


def sensor_costs(store: Store, ep: StackEndpoints, database_url: str, counts: list[int]) -> None:
    import dagster as dg

    os.environ["MIRUS_DATABASE_URL"] = database_url  # the code location's resources, as a code server has them
    from mirus_dagster.dagster_resources import PlatformDatabase, SupervisorPolicy
    from mirus_dagster.definitions import defs

    run_starter, task_supervisor = defs.get_sensor_def("run_starter"), defs.get_sensor_def("task_supervisor")

    print("Sensors on a Postgres-backed Dagster instance, one topic of 4 partitions per connector:")
    engine = make_engine(database_url)
    dagster_db = f"dagster_bench_{int(time.time())}"
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"CREATE DATABASE {dagster_db}"))
    dagster_url = database_url.rsplit("/", 1)[0] + "/" + dagster_db
    resources = {"platform": PlatformDatabase(database_url=database_url), "supervisor": SupervisorPolicy()}
    prefix = f"sens{int(time.time())}"
    created = 0
    overrides = {"storage": {"postgres": {"postgres_url": dagster_url}}}
    with dg.instance_for_test(overrides=overrides) as instance:
        for count in counts:
            new = [f"{prefix}-{i:03d}" for i in range(created, count)]
            common.create_topics(ep.source_bootstrap_servers, dict.fromkeys(new, 4), batch=50)
            common.create_topics(ep.destination_bootstrap_servers, {f"{t}.mirror": 4 for t in new}, batch=50)
            for topic in new:
                connector(store, ep, topic, topic, 2)
            created = count
            mine = {r.name for r in store.list_connectors() if r.name.startswith(prefix)}
            others = len(store.list_connectors()) - len(mine)
            cursor = None

            def tick(_i: int) -> None:
                nonlocal cursor
                context = dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources)
                result = run_starter(context)
                assert result.cursor is not None
                # Every connector due again on the next tick (the worst case: all poll intervals elapsed).
                state = json.loads(result.cursor)
                for poll in state["polls"].values():
                    poll["next_poll_at"] = 0.0
                cursor = json.dumps(state)

            tick(0)  # first tick: new generations and asset events
            starter_ms = median_ms(tick, 3)
            supervisor_ms = median_ms(
                lambda _i: task_supervisor(dg.build_sensor_context(instance=instance, resources=resources)), 3
            )
            print(
                f"  {count:>3} connectors (+{others} others in the store): run_starter tick {starter_ms:7.0f} ms, "
                f"task_supervisor tick {supervisor_ms:5.0f} ms"
            )


def task_memory(store: Store, ep: StackEndpoints, database_url: str, records: int) -> None:
    """A real replicator run (`dagster job execute`, the run worker's code path) copying a pre-loaded topic."""
    topic = f"mem{int(time.time())}"
    common.create_topic(ep.source_bootstrap_servers, topic, 4)
    common.create_topic(ep.destination_bootstrap_servers, f"{topic}.mirror", 4)
    kit.load(ep.source_bootstrap_servers, topic, records, 4)
    config = connector(store, ep, topic, topic, 1)
    store.write_assignment(config.name, {0: [(topic, p) for p in range(4)]})
    with tempfile.TemporaryDirectory() as home:
        run_config = json.dumps({"ops": {"replicate": {"config": {"connector": config.name, "task_id": 0}}}})
        env = {**os.environ, "MIRUS_DATABASE_URL": database_url}
        run = common.dagster_run("replicator", run_config, env, Path(home) / "run.log")
        proc = psutil.Process(run.pid)
        before = peak = 0.0
        started = 0.0
        try:
            while run.poll() is None:
                now = common.rss_mib(common.tree(proc))
                if not started and store.lease_of(config.name, 0):
                    before, started = now, time.perf_counter()  # the task claimed its lease: set up, not copying
                peak = max(peak, now)
                if started and common.committed(store, config.name) >= records:
                    seconds = time.perf_counter() - started
                    # Paused, the task commits and stops, and the run ends.
                    store.set_connector_state(config.name, ConnectorState.PAUSED)
                    run.wait(60)
                    break
                time.sleep(0.05)
        finally:
            if run.poll() is None:
                run.terminate()
                run.wait(30)
    print(
        f"Replicator run (dagster job execute, {records:,} x 100 B over 4 partitions): "
        f"RSS {before:.0f} MB when the task starts, peak {peak:.0f} MB while copying "
        f"at {records / seconds:,.0f} records/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=10_000, help="Partitions one connector's monitor sees.")
    parser.add_argument("--connectors", default="1,10,50", help="Connector counts for the sensor ticks.")
    parser.add_argument("--records", type=int, default=500_000, help="Records for the task memory figure.")
    parser.add_argument("--sections", default="postgres,memory,monitor,sensors", help="Which figures to measure.")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as state:
        stack = common.embedded_stack(Path(state))
        ep = stack.up()
        try:
            engine = make_engine(ep.database_url)
            upgrade(engine)
            store = Store(engine)
            postgres = next((p.pid for p in stack.status() if p.name == "postgres" and p.pid), None)
            sections = set(args.sections.split(","))
            if "postgres" in sections:
                postgres_costs(store, postgres)
            if "memory" in sections:
                task_memory(store, ep, ep.database_url, args.records)
            if "monitor" in sections:
                monitor_costs(store, ep, args.partitions)
            if "sensors" in sections:
                sensor_costs(store, ep, ep.database_url, [int(c) for c in args.connectors.split(",")])
        finally:
            stack.down()


if __name__ == "__main__":
    main()
