"""An estate in miniature, measured whole: connectors on worker runs that `dagster dev`'s run launcher starts.

    MIRUS_SOURCE_BOOTSTRAP_SERVERS=127.0.0.1:39092 MIRUS_DESTINATION_BOOTSTRAP_SERVERS=127.0.0.1:49092 \\
      python benchmarks/estate_miniature.py [--connectors 20] [--partitions 250] [--workers 4] [--rate 5000]

Needs two Apache Kafka clusters (the kit's, `/work/shared/apache-kafka/start.sh`, started fresh: the topics are
created here). Starts the embedded Postgres on a free port (or uses MIRUS_DATABASE_URL) and a real `dagster dev` on
the code location with the platform's dagster.yaml (`mirus/local/devserver.py`; Dagster's DefaultRunLauncher, so
every run is a process the code server starts) and MIRUS_REPLICATOR_WORKERS=`--workers`. Then:

- `--connectors` source topics of `--partitions` partitions, one record in each partition; one connector per topic
  put through the GraphQL API (`put_connector`) with default settings (`topics.whitelist`, tasks.max 1, a warm
  standby per task); the platform creates the destination topics. start: seconds from the first put until every
  partition's offset is committed, and until every task has a standby standing by.
- idle, once every partition is in the dormant tier: resident memory (RSS, and PSS, which counts shared pages once)
  and CPU over `--window` seconds of every worker run's process with its children, the metadata watcher run's,
  Dagster's own processes (`dagster dev`, webserver, daemon, code server), Postgres and the brokers; Postgres
  connections (pg_stat_activity, by database, application name and state, and by the process holding them).
- flowing: `--rate` records/s of 100 bytes spread evenly over every source partition (`estate.py`'s load process,
  one partition after another); after `--warmup` seconds the same figures, and the rate the load process wrote.
- takeover, while the load goes on: the worker run that owns the first connector's task is killed (SIGKILL of its
  process and children, `DagsterDev.kill_run_worker`); the source's end offsets of every partition it owned are taken
  at once (a record at or past them was produced after the kill), and a marker record is written to each of those
  partitions so that each has one promptly. Per task it owned: when its standby claimed the lease, when the first
  record produced after the kill was copied, and when every one of its partitions had copied such a record. Off the
  path: when the supervisor's replacement worker run started.
- nothing lost: once the load has ended and every partition is committed at its source end, `mirus verify`'s check
  (`replicator.tools.verify.verify_replication`) compares every source partition with its destination partition.

Each line carries the 1-minute load average: the machine is shared, figures under load are pessimistic.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import apache_kafka as kit
import common
import estate
import psutil
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from sqlalchemy import text

from mirus.local.devserver import DagsterDev, dagster_dev
from mirus_dagster.constants import (
    ENV_DESTINATION_BOOTSTRAP,
    ENV_REPLICATOR_WORKERS,
    ENV_REPORT_SCHEDULE,
    ENV_SOURCE_BOOTSTRAP,
    PUT_CONNECTOR_JOB,
    STORE_CONNECTOR_OP,
    TAG_WORKER,
    WATCHER_JOB,
    WORKER_JOB,
)
from replicator.clusters import log_offsets
from replicator.engine.source_reader import DORMANT_AFTER_S, QUIET_AFTER_S
from replicator.engine.worker import hosts
from replicator.state.database import make_engine, upgrade
from replicator.state.store import Store
from replicator.tools.verify import verify_replication
from replicator.topics import provenance

# `verify`'s bound on a quiet partition (3 s by default): read from a busy broker, one of 5,000 partitions may yield
# nothing for longer than that although it holds records, and would be left unchecked.
VERIFY_IDLE_S = 30.0
# Dagster's own processes, named by what their command line runs (the first match wins).
DAGSTER_ROLES = (
    ("dagster_webserver", "webserver"),
    ("dagster._daemon", "daemon"),
    ("code-server", "code server"),
    ("api grpc", "code location (the runs' parent)"),
    ("dagster dev", "dagster dev"),
    ("resource_tracker", "code location's resource tracker"),
)


@dataclass
class Groups:
    """The processes measured, by group; each list flat (a run's process and its children are all in it)."""

    procs: dict[str, list[psutil.Process]]
    worker_index: dict[str, str]  # run id -> "worker N"

    def role(self, pid: int) -> str:
        for name, procs in self.procs.items():
            if any(p.pid == pid for p in procs):
                return name
        if pid < 0:
            return "(closed before its process was looked up)"
        return "this benchmark" if pid == os.getpid() else f"pid {pid}"


def listening(ports: Iterable[int]) -> list[psutil.Process]:
    """The processes listening on these TCP ports (the brokers, found whoever started them)."""
    wanted = set(ports)
    pids = {c.pid for c in psutil.net_connections("tcp") if c.status == "LISTEN" and c.laddr.port in wanted and c.pid}
    return [psutil.Process(pid) for pid in sorted(pids)]


def postmaster(store: Store) -> list[psutil.Process]:
    """This platform database's Postgres: the postmaster (the parent of any backend) and all its children."""
    with store.engine.connect() as conn:
        backend = psutil.Process(conn.scalar(text("SELECT pg_backend_pid()")))
    parent = backend.parent()
    return common.tree(parent) if parent is not None else []


def groups(
    dev: DagsterDev, store: Store, brokers: list[int], extra: dict[str, list[psutil.Process]] | None = None
) -> Groups:
    procs: dict[str, list[psutil.Process]] = dict(extra or {})
    index: dict[str, str] = {}
    in_runs: set[int] = set()
    for job, label in ((WORKER_JOB, "worker"), (WATCHER_JOB, "watcher")):
        for run in dev.runs(job_name=job, statuses={"STARTED"}):
            worker = dev.run_worker(run.run_id)
            if worker is None:
                continue
            name = f"{label} {run.tags[TAG_WORKER]}" if job == WORKER_JOB else label
            index[run.run_id] = name
            procs[name] = common.tree(worker)
            in_runs |= {p.pid for p in procs[name]}
    for proc in common.tree(psutil.Process(dev.process.pid)):
        if proc.pid in in_runs:
            continue
        with suppress(psutil.Error):
            line = " ".join(proc.cmdline())
            role = next((r for token, r in DAGSTER_ROLES if token in line), f"other ({proc.name()})")
            procs.setdefault(f"dagster: {role}", []).append(proc)
    procs["postgres"] = postmaster(store)
    procs["brokers"] = listening(brokers)
    return Groups(dict(sorted(procs.items())), index)


def summed(figures: dict[str, tuple[float, ...]], *prefixes: str) -> tuple[float, ...]:
    chosen = [v for k, v in figures.items() if k.startswith(prefixes)]
    return tuple(sum(column) for column in zip(*chosen, strict=True)) if chosen else (0.0, 0.0, 0.0)


def footprint(label: str, found: Groups, window: float) -> dict[str, tuple[float, ...]]:
    """CPU (% of one core) over `window` seconds, then RSS and PSS, per group; printed with the totals."""
    before = {p.pid: common.cpu_s([p]) for procs in found.procs.values() for p in procs}
    time.sleep(window)
    after = {p.pid: common.cpu_s([p]) for procs in found.procs.values() for p in procs if p.is_running()}
    # Only processes alive at both ends count (a Postgres backend that ended took its CPU time with it).
    figures = {
        name: (
            sum(after[p.pid] - before[p.pid] for p in procs if p.pid in after) / window * 100,
            *common.memory_mib(procs),
        )
        for name, procs in found.procs.items()
    }
    print(f"{label} (load {common.load_average():.1f}): CPU over {window:.0f} s, resident memory", flush=True)
    for name, (cpu, rss, pss) in figures.items():
        print(f"  {name:<42} {cpu:6.1f} % CPU  RSS {rss:6.0f} MiB  PSS {pss:6.0f} MiB", flush=True)
    totals = {
        "worker runs": summed(figures, "worker "),
        "worker runs + watcher": summed(figures, "worker ", "watcher"),
        "Dagster's own": summed(figures, "dagster: "),
        "platform (runs + Dagster)": summed(figures, "worker ", "watcher", "dagster: "),
    }
    for name, (cpu, rss, pss) in totals.items():
        print(f"  = {name:<40} {cpu:6.1f} % CPU  RSS {rss:6.0f} MiB  PSS {pss:6.0f} MiB", flush=True)
    return {**figures, **totals}


def connections(store: Store, found: Groups, port: int) -> None:
    """Postgres's client connections, by database, application name and state, then by the process holding each."""
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT coalesce(datname, ''), coalesce(nullif(application_name, ''), '(none)'), "
                "coalesce(state, ''), client_port FROM pg_stat_activity "
                "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
            )
        ).all()
    owners = {
        c.laddr.port: c.pid
        for c in psutil.net_connections("tcp")
        if c.raddr and c.raddr.port == port and c.pid is not None
    }
    by_state = Counter((d, a, s) for d, a, s, _ in rows)
    by_process = Counter((found.role(owners.get(p, -1)), s) for _d, _a, s, p in rows)
    print(f"  Postgres client connections: {len(rows)} (not counting this query's)", flush=True)
    for (database, app, state), n in sorted(by_state.items()):
        print(f"    {n:3d}  database {database}, application {app}, {state}", flush=True)
    for (role, state), n in sorted(by_process.items()):
        print(f"    {n:3d}  {role}: {state}", flush=True)


def put_connectors(dev: DagsterDev, names: list[str], src: str, dst: str) -> None:
    runs = []
    for name in names:
        properties = {
            "name": name,
            "connector.class": "com.salesforce.mirus.MirusSourceConnector",
            "consumer.bootstrap.servers": src,
            "destination.consumer.bootstrap.servers": dst,
            "topics.whitelist": name,
        }
        config = {"ops": {STORE_CONNECTOR_OP: {"config": {"properties": properties}}}}
        runs.append(dev.client.submit_job_execution(PUT_CONNECTOR_JOB, run_config=config))
    for run in runs:
        dev.wait_for_status(run, {"SUCCESS"}, timeout=600)


def owner_runs(store: Store, names: list[str]) -> dict[str, str]:
    """connector -> the run id of the worker holding its task 0's lease (owner `host:pid:run id`)."""
    owners = {}
    for name in names:
        lease = store.lease_of(name, 0)
        if lease is not None and lease.owner and lease.state == "RUNNING":
            owners[name] = lease.owner.rsplit(":", 1)[-1]
    return owners


def hosting(dev: DagsterDev, store: Store, names: list[str], workers_: int) -> str:
    """What each live worker run hosts: the tasks it owns (leases) and those it stands by for (`hosts`)."""
    owners = Counter(owner_runs(store, names).values())
    shown = []
    for run in sorted(dev.runs(job_name=WORKER_JOB, statuses={"STARTED"}), key=lambda r: r.tags[TAG_WORKER]):
        index = int(run.tags[TAG_WORKER])
        hosted = sum(index in hosts(n, 0, workers_, 2) for n in names)
        owned = owners.get(run.run_id, 0)
        shown.append(f"worker {index} owns {owned}, stands by for {hosted - owned}")
    return "; ".join(shown)


def standing_by(dev: DagsterDev, names: list[str]) -> bool:
    """Every task has a copy standing by in a live worker run (its event says so)."""
    messages = [m for run in dev.runs(job_name=WORKER_JOB, statuses={"STARTED"}) for m in dev.run_messages(run.run_id)]
    return all(any(m.startswith(f"{name}-0: standing by") for m in messages) for name in names)


def every_partition_committed(store: Store, names: list[str], ends: dict[str, int]) -> Callable[[], bool]:
    return lambda: all(common.committed(store, n) >= ends[n] for n in names)


def takeover(dev: DagsterDev, store: Store, names: list[str], partitions: int, timeout: float) -> None:
    """Kill the worker run owning the first connector's task; per task it owned, when it copies again."""
    src, dst = kit.SOURCE, kit.DESTINATION
    owners = owner_runs(store, names)
    victim = owners[names[0]]
    owned = [n for n in names if owners.get(n) == victim]
    wanted = [(n, p) for n in owned for p in range(partitions)]
    before = {n: lease.epoch for n in owned if (lease := store.lease_of(n, 0)) is not None}
    destination_ends = log_offsets(AdminClient({"bootstrap.servers": dst}), wanted, latest=True)
    reader = Consumer(
        {"bootstrap.servers": dst, "group.id": "estate-miniature", "enable.auto.commit": False, "fetch.wait.max.ms": 10}
    )
    reader.assign([TopicPartition(t, p, destination_ends[(t, p)]) for t, p in wanted])
    reader.consume(1, 2.0)
    source = AdminClient({"bootstrap.servers": src})
    markers = Producer({"bootstrap.servers": src, "linger.ms": 5})
    markers.list_topics(timeout=10)  # connected before the kill
    print(
        f"takeover: killing the worker run {victim[:8]}, owner of {len(owned)} task(s) "
        f"(load {common.load_average():.1f})",
        flush=True,
    )
    killed = dev.kill_run_worker(victim)  # returns once the worker and its children are gone
    kill_point = log_offsets(source, wanted, latest=True)  # a record at or past these was produced after the kill
    for topic, partition in wanted:
        markers.produce(topic, b"after the kill", None, partition)
    markers.flush(30)
    first: dict[tuple[str, int], float] = {}
    deadline = killed.monotonic + timeout
    while len(first) < len(wanted) and time.monotonic() < deadline:
        for msg in reader.consume(5000, 0.05):
            origin = provenance.parse(msg.headers()) if msg.error() is None else None
            if origin is None:
                continue
            key = (origin.source_topic, origin.source_partition)
            if key not in first and origin.source_offset >= kill_point.get(key, 1 << 62):
                first[key] = time.monotonic() - killed.monotonic
    reader.close()
    if len(first) < len(wanted):
        print(f"  only {len(first)} of {len(wanted)} partitions copied again within {timeout:.0f} s", flush=True)
    for name in owned:
        lease = store.lease_of(name, 0)
        claimed = lease.claimed_at.timestamp() - killed.at if lease and lease.claimed_at else float("nan")
        times = [first[(name, p)] for p in range(partitions) if (name, p) in first]
        epoch = f"epoch {before.get(name, '?')} -> {lease.epoch if lease else '?'}"
        print(
            f"  {name}: standby claimed +{claimed:.2f} s ({epoch}); first record produced after the kill copied "
            f"+{min(times, default=float('nan')):.2f} s; every partition ({len(times)}/{partitions}) "
            f"+{max(times, default=float('nan')):.2f} s",
            flush=True,
        )
    print(
        f"  worker killed -> all {len(owned)} task(s) replicating again: {max(first.values(), default=0):.2f} s "
        f"(load {common.load_average():.1f})",
        flush=True,
    )
    replacement = dev.wait_for_runs(
        job_name=WORKER_JOB,
        statuses={"STARTED"},
        where=lambda r: r.creation_time > killed.at,
        timeout=300,
        what="the replacement worker run",
    )[0]
    print(
        f"  off the path: replacement worker run requested +{replacement.creation_time - killed.at:.1f} s "
        f"({replacement.tags.get('dagster/sensor_name')}), started "
        f"+{(replacement.start_time or killed.at) - killed.at:.1f} s",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connectors", type=int, default=20)
    parser.add_argument("--partitions", type=int, default=250)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rate", type=int, default=5000, help="records/s spread over every source partition")
    parser.add_argument("--window", type=float, default=30.0, help="seconds each CPU figure is measured over")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds of load before it is measured")
    parser.add_argument("--takeover-timeout", type=float, default=120.0)
    args = kit.parse_args(parser)
    # The platform is pointed at the clusters the kit module found (the environment's, or the kit's defaults).
    os.environ[ENV_SOURCE_BOOTSTRAP], os.environ[ENV_DESTINATION_BOOTSTRAP] = kit.SOURCE, kit.DESTINATION
    src, dst = kit.SOURCE, kit.DESTINATION
    brokers = [int(b.rsplit(":", 1)[1]) for b in (src, dst)]
    prefix = f"mini{int(time.time())}"
    names = [f"{prefix}-{i:02d}" for i in range(args.connectors)]
    total = args.connectors * args.partitions
    print(
        f"{args.connectors} connectors x {args.partitions} partitions ({total:,}) on {args.workers} worker runs; "
        f"{os.cpu_count()} cores; source {src}, destination {dst} (load {common.load_average():.1f})",
        flush=True,
    )
    started = time.monotonic()
    common.create_topics(src, dict.fromkeys(names, args.partitions))
    kit.fill(names, args.partitions)
    print(
        f"source topics created and filled in {time.monotonic() - started:.0f} s (load {common.load_average():.1f})",
        flush=True,
    )
    ends = common.end_offsets(src, names, args.partitions)

    with tempfile.TemporaryDirectory(prefix="estate-miniature-") as state:
        stack = common.embedded_stack(Path(state), {"postgres_port": common.free_port()})
        endpoints = stack.up()
        store = Store(make_engine(endpoints.database_url, pool_size=1, max_overflow=0))
        pg_port = store.engine.url.port or 5432
        loader = None
        try:
            upgrade(store.engine)
            env = {**endpoints.as_env(), ENV_REPLICATOR_WORKERS: str(args.workers), ENV_REPORT_SCHEDULE: "stopped"}
            with dagster_dev(env, Path(state) / "dagster-dev") as dev:
                print(f"dagster dev on {dev.url} (log: {dev.log}; load {common.load_average():.1f})", flush=True)
                put_at = time.monotonic()
                put_connectors(dev, names, src, dst)
                print(f"{args.connectors} connectors put in {time.monotonic() - put_at:.1f} s", flush=True)
                dev.until(every_partition_committed(store, names, ends), 900, "every partition committed", 1.0)
                print(
                    f"start: every partition committed {time.monotonic() - put_at:.1f} s after the first put "
                    f"(load {common.load_average():.1f})",
                    flush=True,
                )
                dev.until(lambda: standing_by(dev, names), 300, "a standby standing by for every task", 2.0)
                print(
                    f"start: every task with a standby standing by {time.monotonic() - put_at:.1f} s after the first "
                    f"put; {hosting(dev, store, names, args.workers)}",
                    flush=True,
                )

                time.sleep(QUIET_AFTER_S + DORMANT_AFTER_S + 5)  # every partition in the dormant tier
                found = groups(dev, store, brokers)
                footprint("idle", found, args.window)
                connections(store, found, pg_port)

                seconds = args.warmup + args.window + args.takeover_timeout + 30
                loader = estate.start_load(names, args.partitions, args.rate, seconds)
                load_ends = time.monotonic() + seconds
                time.sleep(args.warmup)
                found = groups(dev, store, brokers, {"load generator (not the platform)": [psutil.Process(loader.pid)]})
                footprint(f"{args.rate:,} records/s over {total:,} partitions", found, args.window)
                connections(store, found, pg_port)

                takeover(dev, store, names, args.partitions, min(args.takeover_timeout, load_ends - time.monotonic()))
                time.sleep(max(load_ends - time.monotonic(), 0))
                print(f"load written at {estate.written(loader):,.0f} records/s", flush=True)
                loader = None

                ends = common.end_offsets(src, names, args.partitions)
                caught_up = time.monotonic()
                dev.until(every_partition_committed(store, names, ends), 600, "every partition committed", 1.0)
                print(
                    f"every partition committed at its source end {time.monotonic() - caught_up:.1f} s after the load "
                    f"ended",
                    flush=True,
                )
                found = groups(dev, store, brokers)
                footprint("after the load and the takeover", found, args.window)
                report = verify_replication(
                    {"bootstrap.servers": src},
                    {"bootstrap.servers": dst},
                    {n: n for n in names},
                    timeout_s=900,
                    idle_s=VERIFY_IDLE_S,
                )
                totals = ", ".join(f"{k} {v:,}" for k, v in report.totals.items())
                print(f"verify: {report.verdict} in {report.elapsed_s:.0f} s: {totals}", flush=True)
                for note in report.notes[:10]:
                    print(f"  note: {note}", flush=True)
        finally:
            if loader is not None:
                loader.kill()
                loader.wait(30)
            store.engine.dispose()
            stack.down()
            for bootstrap in (src, dst):
                try:
                    common.delete_topics(bootstrap, names)
                except Exception as exc:  # Kafka 1.0 can take minutes over thousands of partitions: say so, go on
                    print(f"deleting the topics on {bootstrap}: {exc}", file=sys.stderr)


if __name__ == "__main__":
    main()
