"""An estate of many small connectors: a Dagster run per task and per standby, against worker runs hosting them.

    python benchmarks/workers.py [--connectors 20] [--partitions 50] [--workers 4] [--rounds 2]

Needs the two Apache Kafka clusters running (see `benchmarks/apache_kafka.py`) and the embedded Postgres (or
`MIRUS_DATABASE_URL`). Per round and layout (alternating, each on a fresh database and fresh topics), `--connectors`
connectors with default settings (tasks.max 1, task.standby.runs 1), each copying a topic of `--partitions`
partitions with one record in each source partition:
- `runs`: what the sensors launch without MIRUS_REPLICATOR_WORKERS: a run of the `replicator` job per task and per
  standby, each its own `dagster job execute` process (2 x connectors processes);
- `workers`: MIRUS_REPLICATOR_WORKERS=`--workers`: that many runs of the `replicator_worker` job, each task hosted by
  two of them (its owner and its standby).
Printed per layout: processes; start (seconds from the first process start until every partition is committed);
once idle, resident memory of all processes (RSS, and PSS, which counts shared pages once), their CPU over 20 s and
the platform database's connections; takeover: the process owning the first connector's task is killed (SIGKILL)
and one record produced to every topic whose task it owned: seconds until each is committed by the standby (a
worker's kill hands over every task it owned at once).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import apache_kafka as kit
import common
import psutil
from apache_kafka import DESTINATION, SOURCE
from confluent_kafka import Producer
from sqlalchemy import Engine, text

from mirus.waiting import wait_until
from replicator.state.database import make_engine
from replicator.state.store import Store

IDLE_AFTER_S = 10.0
WINDOW_S = 20.0


@dataclass
class Figures:
    layout: str
    processes: int
    start_s: float
    rss_mb: float
    pss_mb: float
    idle_cpu_pct: float
    connections: int
    takeover_s: float
    handed_over: int


def task_config(connector: str) -> str:
    return f"ops:\n  replicate:\n    config:\n      connector: {connector!r}\n      task_id: 0\n"


def worker_config(worker: int, workers: int) -> str:
    return f"ops:\n  host_tasks:\n    config:\n      worker: {worker}\n      workers: {workers}\n"


def measure(layout: str, server: Engine, names: list[str], partitions: int, workers: int, tag: str) -> Figures:
    with common.fresh_database(server, f"bench_workers_{tag}") as url:
        store = Store(make_engine(url, pool_size=1, max_overflow=0))
        try:
            return measure_layout(layout, store, url, names, partitions, workers, tag)
        finally:
            store.engine.dispose()


def measure_layout(
    layout: str, store: Store, url: str, names: list[str], partitions: int, workers: int, tag: str
) -> Figures:
    for name in names:
        kit.put_engine_connector(store, name, name, "", partitions, 1)
    # The first layout's takeover left a record more in some topics.
    ends = common.end_offsets(SOURCE, names, partitions)
    env = {**os.environ, "MIRUS_DATABASE_URL": url}
    logs = Path(tempfile.mkdtemp(prefix=f"bench-workers-{tag}-"))
    started = time.monotonic()
    if layout == "runs":
        popens = [
            common.dagster_run("replicator", task_config(n), env, logs / f"{n}-{copy}.log")
            for n in names
            for copy in (0, 1)
        ]
    else:
        popens = [
            common.dagster_run("replicator_worker", worker_config(w, workers), env, logs / f"worker-{w}.log")
            for w in range(workers)
        ]
    procs = [psutil.Process(p.pid) for p in popens]
    try:
        wait_until(
            lambda: all(common.committed(store, n) == ends[n] for n in names),
            timeout=600,
            interval=0.2,
            what=f"{layout}: every partition committed (logs in {logs})",
        )
        start_s = time.monotonic() - started
        time.sleep(IDLE_AFTER_S)  # a fixed wait on purpose: what is measured is the idle state after it
        before = common.cpu_s(q for p in procs for q in common.tree(p))
        time.sleep(WINDOW_S)
        idle_cpu_pct = (common.cpu_s(q for p in procs for q in common.tree(p)) - before) / WINDOW_S * 100
        rss_mb, pss_mb = common.memory_mib(q for p in procs for q in common.tree(p))
        with store.engine.connect() as conn:
            connections = conn.scalar(text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"))
        connections -= 1  # this query's own

        # Takeover: kill the process owning the first connector's task; a record to each topic it owned.
        owner = store.lease_of(names[0], 0)
        assert owner is not None
        pid = int(owner.owner.split(":")[1])
        owned = [n for n in names if (lease := store.lease_of(n, 0)) and int(lease.owner.split(":")[1]) == pid]
        os.kill(pid, signal.SIGKILL)
        killed, killed_at = time.monotonic(), time.time()
        producer = Producer({"bootstrap.servers": SOURCE, "linger.ms": 0})
        for name in owned:
            producer.produce(name, b"after the kill", partition=0)
        producer.flush(30)
        wait_until(
            lambda: all(common.committed(store, n) == ends[n] + 1 for n in owned),
            timeout=120,
            interval=0.05,
            what=f"{layout}: the standbys took over {len(owned)} task(s)",
        )
        takeover_s = time.monotonic() - killed
        claims = sorted(store.lease_of(n, 0).claimed_at.timestamp() - killed_at for n in owned)
        print(f"  {layout}: claimed {', '.join(f'{c:.2f}' for c in claims)} s after the kill", flush=True)
    finally:
        for p in popens:
            with suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)
    return Figures(layout, len(popens), start_s, rss_mb, pss_mb, idle_cpu_pct, int(connections), takeover_s, len(owned))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connectors", type=int, default=20)
    parser.add_argument("--partitions", type=int, default=50)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--layouts", default="runs,workers", help="which to measure (e.g. `workers` alone)")
    args = kit.parse_args(parser)
    results: list[Figures] = []
    names = [f"bench-workers-{os.getpid()}-{c}" for c in range(args.connectors)]
    for bootstrap in (SOURCE, DESTINATION):
        common.create_topics(bootstrap, dict.fromkeys(names, args.partitions))
    kit.fill(names, args.partitions)
    try:
        with common.platform_database() as platform:
            for round_ in range(args.rounds):
                # Each layout on a database of its own: it copies every topic from the start, the same work for both.
                layouts = args.layouts.split(",")
                order = layouts if round_ % 2 == 0 else layouts[::-1]
                for layout in order:
                    figures = measure(
                        layout, platform.engine, names, args.partitions, args.workers, f"{round_}_{layout}"
                    )
                    results.append(figures)
                    print(
                        f"round {round_ + 1} {layout:8s} processes {figures.processes:3d}  start "
                        f"{figures.start_s:6.1f}s  RSS {figures.rss_mb:7.0f} MiB  PSS {figures.pss_mb:7.0f} MiB  "
                        f"idle CPU {figures.idle_cpu_pct:5.1f}%  connections {figures.connections:3d}  takeover "
                        f"{figures.takeover_s:4.1f}s ({figures.handed_over} task(s))",
                        flush=True,
                    )
    finally:
        for bootstrap in (SOURCE, DESTINATION):
            try:
                common.delete_topics(bootstrap, names)
            except Exception as exc:  # Kafka 1.0 can take minutes over thousands of partitions: say so, go on
                print(f"deleting the topics on {bootstrap}: {exc}", file=sys.stderr)
    print(
        f"\n{args.connectors} connectors x {args.partitions} partitions, task.standby.runs 1; "
        f"medians of {args.rounds} round(s)"
    )
    for layout in args.layouts.split(","):
        mine = [f for f in results if f.layout == layout]
        print(
            f"{layout:8s} processes {mine[0].processes:3d}  start {median(f.start_s for f in mine):6.1f}s  "
            f"RSS {median(f.rss_mb for f in mine):7.0f} MiB  PSS {median(f.pss_mb for f in mine):7.0f} MiB  "
            f"idle CPU {median(f.idle_cpu_pct for f in mine):5.1f}%  connections "
            f"{median(f.connections for f in mine):5.0f}  takeover {median(f.takeover_s for f in mine):4.1f}s"
        )


if __name__ == "__main__":
    main()
