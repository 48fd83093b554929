"""Orchestration latency under a real `dagster dev` on Apache Kafka: how fast the platform reacts, with default
connector settings, and where the time goes.

    python benchmarks/orchestration_latency.py [--topics 10] [--kills 10] [--held 1000] [--held-topics 10]
        [--shape workers|tasks|both] [--workers 2]

Runs on the kit's clusters (`benchmarks/apache_kafka.py`: source 127.0.0.1:39092, destination 127.0.0.1:49092),
which it leaves running, with a private Postgres (or MIRUS_DATABASE_URL). Per shape, on a database of its own, the
platform as `mirus dev --no-demo` starts it (`dagster dev` on the code location with the platform's dagster.yaml:
its sensors start the metadata watcher run and the replicator runs), one connector put through the GraphQL API with
default settings (`topics.regex` only) that holds `--held` idle partitions from the start (`--held-topics` topics
created up front on both clusters), so every reaction happens in a task that has them. `workers` (the default
shape) sets MIRUS_REPLICATOR_WORKERS=`--workers`, so the task's owner and its standby are copies in two worker runs;
`tasks` sets it to 0: an owner run and a warm standby run per task.

(a) new topic → first copy: the clock starts, the source topic is created and one record written to it; the clock
    stops when the destination partition's high watermark says the copy is there (asked every 5 ms).
(b) kill -9 → resumed replication: while a producer writes 50 records/s, the process of the run that owns the task
    (and its children) is killed; the clock stops at the first destination record whose source offset (its
    `mirus.source` header) is above the highest offset acknowledged at the source by the kill (+50 ms), as a reader on
    a thread of its own sees it.

Each reaction is printed with its stages, in seconds from the clock's start. From what the platform records:
the watcher's first source snapshot naming the topic (metadata seen), the assignment row (stored), the partition's
status row (claimed by the task), the lease row (a standby's claim). From the engine's DEBUG lines, which this script
turns on in the platform's processes (a `sitecustomize` on their PYTHONPATH writes them to a file per process): the
change notice reaching the owner's process (task notified), the partition placed in a source consumer, and the
consumer's first records of it reaching the task's loop (first fetch). The destination topic's creation and the copy
are seen by this script. The summary gives each stage's median and the median step from the stage before.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import apache_kafka as kit
import common
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from mirus.local.devserver import DagsterDev, RunInfo, dagster_dev
from mirus.waiting import wait_until
from mirus_dagster.constants import (
    ENV_REPLICATOR_WORKERS,
    ENV_REPORT_SCHEDULE,
    PUT_CONNECTOR_JOB,
    REPLICATOR_JOB,
    STORE_CONNECTOR_OP,
    TAG_CONNECTOR,
    TAG_TASK,
    WATCHER_JOB,
    WORKER_JOB,
)
from mirus_dagster.settings import StackEndpoints
from replicator.state.database import make_engine
from replicator.state.store import Store
from replicator.topics import provenance

TARGET_NEW_TOPIC_S = 1.0
TARGET_KILL_S = 1.0
ACK_MARGIN_S = 0.05
CONNECTOR = "latency"
TAGS = {TAG_CONNECTOR: CONNECTOR, TAG_TASK: "0"}
# The engine's DEBUG lines that mark stages (replicator/state/head_notices.py, replicator/engine/source_reader.py),
# written by every platform process to `trace-<pid>.log` in the directory MIRUS_BENCH_TRACE_DIR names.
TRACED = ("replicator.state.head_notices", "replicator.engine.source_reader")
SITECUSTOMIZE = f"""import logging, os
_handler = logging.FileHandler(
    os.path.join(os.environ["MIRUS_BENCH_TRACE_DIR"], f"trace-{{os.getpid()}}.log"), delay=True
)
_handler.setFormatter(logging.Formatter("%(created).6f %(name)s %(message)s"))
for _name in {TRACED!r}:
    logging.getLogger(_name).setLevel(logging.DEBUG)
    logging.getLogger(_name).addHandler(_handler)
"""
NOTIFIED, PLACED, FETCHED = "notified: ", " consumer assigned ", "first records fetched of: "


@dataclass(frozen=True)
class Shape:
    """Where the task runs: `job`'s runs matching `tags` (the run per task, or every worker run)."""

    name: str
    job: str
    tags: dict[str, str]
    env: dict[str, str]


def shapes(workers: int) -> dict[str, Shape]:
    return {
        "workers": Shape("workers", WORKER_JOB, {}, {ENV_REPLICATOR_WORKERS: str(workers)}),
        "tasks": Shape("tasks", REPLICATOR_JOB, TAGS, {ENV_REPLICATOR_WORKERS: "0"}),
    }


Stages = list[tuple[str, float | None]]  # (stage, seconds from the clock's start; None: not seen)


class Traces:
    """The engine's stage lines, as the platform's processes wrote them (wall-clock times)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def first(self, pid: int, marker: str, name: str, after: float) -> float | None:
        """When process `pid` first logged a `marker` line naming `name` (a connector or topic) after `after`."""
        path = self.directory / f"trace-{pid}.log"
        if not path.exists():
            return None
        for line in path.read_text(errors="replace").splitlines():
            created, _, rest = line.partition(" ")
            if marker in rest and name in rest.split(": ", 1)[-1].split() and float(created) > after:
                return float(created)
        return None


def sitecustomize(directory: Path) -> dict[str, str]:
    """The environment that makes the platform's processes write the engine's stage lines into `directory`."""
    site = directory / "site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(p for p in (str(site), str(common.ROOT), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "MIRUS_BENCH_TRACE_DIR": str(directory)}


def owner_pid(store: Store) -> int:
    """The process holding task 0's lease (its owner is "host:pid:run id")."""
    lease = store.lease_of(CONNECTOR, 0)
    assert lease is not None and lease.owner, "task 0 has no owner"
    return int(lease.owner.rsplit(":", 2)[1])


def owner_run(dev: DagsterDev, store: Store, shape: Shape, timeout: float = 180) -> RunInfo:
    """The started run that owns task 0, once another live run stands by for it (it logged so)."""

    def ready() -> RunInfo | None:
        live = {r.run_id: r for r in dev.runs(shape.tags, job_name=shape.job, statuses={"STARTED"})}
        lease = store.lease_of(CONNECTOR, 0)
        owner = lease.owner.rsplit(":", 1)[-1] if lease and lease.owner and lease.state == "RUNNING" else None
        if owner not in live:
            return None
        standing_by = any(
            ": standing by: epoch" in message
            for run_id in live
            if run_id != owner
            for message in dev.run_messages(run_id)
        )
        return live[owner] if standing_by else None

    return dev.until(ready, timeout, "an owner run and a standby standing by", interval=0.2)


class Traffic:
    """A producer writing `rate` records/s to partition 0 of `topic`, remembering when each offset was acknowledged."""

    def __init__(self, bootstrap: str, topic: str, rate: float) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "enable.idempotence": True})
        self.topic, self.interval = topic, 1.0 / rate
        self.acks: list[tuple[float, int]] = []  # (monotonic time of the acknowledgement, offset)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _delivered(self, err: object, msg: Message) -> None:
        if err is None:
            self.acks.append((time.monotonic(), msg.offset()))

    def _run(self) -> None:
        i = 0
        next_at = time.monotonic()
        while not self.stopped.is_set():
            self.producer.produce(self.topic, b"v%d" % i, b"k%d" % i, 0, on_delivery=self._delivered)
            self.producer.poll(0)
            i += 1
            next_at += self.interval
            self.stopped.wait(max(0.0, next_at - time.monotonic()))  # pacing
        self.producer.flush(30)

    def acked_by(self, at: float) -> int:
        """Highest offset acknowledged by monotonic time `at`."""
        self.producer.poll(0)
        return max((offset for when, offset in list(self.acks) if when <= at), default=-1)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(60)
        del self.producer  # its broker connections close now


class Arrivals:
    """Every record the destination reader receives, with its arrival time and source offset, read on a thread of
    its own (so that nothing the benchmark waits for delays when a copy is seen)."""

    def __init__(self, reader: Consumer) -> None:
        self.reader = reader
        self.seen: list[tuple[float, int]] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            for msg in self.reader.consume(100, 0.01):
                origin = provenance.parse(msg.headers()) if msg.error() is None else None
                if origin is not None:
                    self.seen.append((time.monotonic(), origin.source_offset))

    def first(self, since: float = 0.0, above: int = -1) -> float | None:
        """When the first record that arrived after `since` with a source offset above `above` did, if one has."""
        return next((at for at, offset in list(self.seen) if at > since and offset > above), None)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(10)


def destination_reader(bootstrap: str, topic: str) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-latency",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "fetch.wait.max.ms": 10,
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    return consumer


def _high_watermark(consumer: Consumer, topic: str) -> int:
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=2, cached=False)[1])
    except KafkaException:  # not known to this client yet
        return -1


def _has_leader(admin: AdminClient, topic: str) -> bool:
    partitions = admin.list_topics(topic, timeout=5).topics[topic].partitions
    return 0 in partitions and partitions[0].leader >= 0


def _epoch(store: Store, sql: str, **params: object) -> float | None:
    with store.engine.connect() as conn:
        value = conn.exec_driver_sql(sql, params).scalar()
    return None if value is None else float(value)


def new_topic_latency(store: Store, traces: Traces, topic: str) -> tuple[float, Stages]:
    """Create `topic` with one record; seconds until its copy is in the destination's log, and the stages."""
    src, dst = kit.SOURCE, kit.DESTINATION
    producer = Producer({"bootstrap.servers": src, "linger.ms": 0})
    producer.list_topics(timeout=10)  # connected before the clock starts
    looker = AdminClient({"bootstrap.servers": dst})
    looker.list_topics(timeout=10)
    ends = Consumer({"bootstrap.servers": dst, "group.id": "bench-latency"})
    ends.list_topics(timeout=10)
    pid = owner_pid(store)
    try:
        started, started_wall = time.monotonic(), time.time()
        common.create_topic(src, topic)
        producer.produce(topic, b"first", b"k", 0)
        producer.flush(10)
        # The platform creates the destination topic (topic.creation.enable, the default) ...
        wait_until(lambda: _has_leader(looker, topic), 60, 0.005, f"destination topic {topic}")
        created = time.monotonic() - started
        # ... and the clock stops when the destination's log holds the copy: no consumer's fetch wait is counted.
        wait_until(lambda: _high_watermark(ends, topic) >= 1, 60, 0.005, f"the copy in {topic}")
        latency = time.monotonic() - started
    finally:
        ends.close()
    seen = _epoch(
        store,
        "SELECT extract(epoch FROM min(taken_at)) FROM metadata_snapshots WHERE connector = %(c)s "
        "AND cluster = 'source' AND topics ? %(t)s",
        c=CONNECTOR,
        t=topic,
    )
    assigned = _epoch(
        store,
        "SELECT extract(epoch FROM min(created_at)) FROM assignments WHERE connector = %(c)s AND partitions @> "
        "%(p)s::jsonb",
        c=CONNECTOR,
        p=f'[["{topic}", 0]]',
    )
    claimed = _epoch(
        store,
        "SELECT extract(epoch FROM updated_at) FROM partition_status WHERE connector = %(c)s AND topic = %(t)s",
        c=CONNECTOR,
        t=topic,
    )
    walls = [
        ("metadata seen", seen),
        ("assignment stored", assigned),
        ("task notified", traces.first(pid, NOTIFIED, CONNECTOR, assigned or started_wall)),
        ("partition claimed", claimed),
        ("in a consumer", traces.first(pid, PLACED, topic, started_wall)),
        ("first fetch", traces.first(pid, FETCHED, topic, started_wall)),
    ]
    stages: Stages = [(name, None if at is None else at - started_wall) for name, at in walls]
    stages.insert(1, ("destination topic created", created))
    return latency, [*stages, ("copy at the destination", latency)]


def kill_latency(
    dev: DagsterDev, store: Store, shape: Shape, traces: Traces, traffic: Traffic, reader: Consumer
) -> tuple[float, Stages, str]:
    """Kill the owner run's process; seconds until a record produced after the kill is copied, the stages, and what
    happened off the path."""
    victim = owner_run(dev, store, shape)
    lease = store.lease_of(CONNECTOR, 0)
    assert lease is not None, "owner_run returned a run that holds no lease"
    epoch = lease.epoch
    while reader.consume(1000, 0):
        pass  # copies made before the kill
    arrivals = Arrivals(reader)
    try:
        killed = dev.kill_run_worker(victim.run_id)  # returns once the worker and its children are gone
        killed_at, killed_wall = killed.monotonic, killed.at  # the clock starts when SIGKILL was sent
        gone_s = time.monotonic() - killed_at  # until psutil saw the processes gone (reaped by their parent)
        # Everything acknowledged at the source by the kill may have been read by the dead process (a fetch may see a
        # record up to ACK_MARGIN_S before its producer hears the acknowledgement); what was acknowledged later not.
        kill_point = traffic.acked_by(killed_at + ACK_MARGIN_S)
        arrived = wait_until(lambda: arrivals.first(above=kill_point), 120, 0.01, "a record written after the kill")
        # The dead owner's last produce requests are answered within milliseconds of the kill.
        first_copy = arrivals.first(since=killed_at + 0.1) or arrived
    finally:
        arrivals.stop()
    latency = arrived - killed_at
    lease = store.lease_of(CONNECTOR, 0)
    assert lease is not None and lease.claimed_at is not None and lease.epoch > epoch
    pid = owner_pid(store)
    claimed = _epoch(
        store,
        "SELECT extract(epoch FROM updated_at) FROM partition_status WHERE connector = %(c)s AND topic = %(t)s",
        c=CONNECTOR,
        t=traffic.topic,
    )
    walls = [
        ("standby claimed the lease", lease.claimed_at.timestamp()),
        ("partition claimed", claimed),
        ("in a consumer", traces.first(pid, PLACED, traffic.topic, killed_wall)),
        ("first fetch", traces.first(pid, FETCHED, traffic.topic, killed_wall)),
    ]
    stages: Stages = [(name, None if at is None else at - killed_wall) for name, at in walls]
    stages += [("first copy (a replay)", first_copy - killed_at), ("copy written after the kill", latency)]
    failed = dev.wait_for_status(victim.run_id, {"FAILURE"}, timeout=30)
    (new,) = dev.wait_for_runs(
        shape.tags, statuses={"STARTED"}, where=lambda r: r.creation_time > killed_wall, job_name=shape.job, timeout=240
    )
    aside = (
        f"dead processes reaped +{gone_s:.2f}s, run FAILURE +{(failed.end_time or killed_wall) - killed_wall:.1f}s, "
        f"new standby run requested +{new.creation_time - killed_wall:.1f}s, "
        f"started +{(new.start_time or killed_wall) - killed_wall:.1f}s"
    )
    return latency, stages, aside


def resident_memory(dev: DagsterDev, store: Store, shape: Shape) -> str:
    """Resident memory of the owner, standby and watcher run processes (each with its children)."""
    owner = owner_run(dev, store, shape)
    standby = [r for r in dev.runs(shape.tags, job_name=shape.job, statuses={"STARTED"}) if r.run_id != owner.run_id]
    watcher = dev.runs(job_name=WATCHER_JOB, statuses={"STARTED"})
    shown = []
    for label, runs in (("owner", [owner]), ("standby", standby[:1]), ("watcher", watcher[:1])):
        worker = dev.run_worker(runs[0].run_id) if runs else None
        if worker is not None:
            shown.append(f"{label} {common.rss_mib(common.tree(worker)):.0f} MB")
    return ", ".join(shown)


def shown(stages: Stages) -> str:
    return ", ".join(f"{name} {'?' if at is None else f'+{at:.2f}'}" for name, at in stages)


def summary(label: str, latencies: list[float], runs: list[Stages], target: float) -> None:
    """The median and maximum, then each stage's median time and the median step from the stage seen before it."""
    if not latencies:
        return
    median = statistics.median(latencies)
    verdict = "met" if median <= target else "NOT MET"
    print(f"{label}: median {median:.2f} s (target <= {target:.0f} s: {verdict}); max {max(latencies):.2f} s")
    for i, (name, _) in enumerate(runs[0]):
        at: list[float] = []
        steps: list[float] = []
        for stages in runs:
            if (this := stages[i][1]) is not None:
                before = [t for _, t in stages[:i] if t is not None]
                at.append(this)
                steps.append(this - (before[-1] if before else 0.0))
        if at:
            print(f"    {name:<30} at {statistics.median(at):5.2f} s   step {statistics.median(steps):5.2f} s")
        else:
            print(f"    {name:<30} not seen")


@contextmanager
def held_topics(names: list[str], partitions: int) -> Iterator[None]:
    """The idle topics every connector holds, on both clusters, deleted afterwards (the kit stays running)."""
    if not names:
        yield
        return
    for bootstrap in (kit.SOURCE, kit.DESTINATION):
        common.create_topics(bootstrap, dict.fromkeys(names, partitions), timeout_s=600)
    try:
        yield
    finally:
        for bootstrap in (kit.SOURCE, kit.DESTINATION):
            with suppress(Exception):  # a leftover costs the kit metadata, not a result
                common.delete_topics(bootstrap, names)


def measure(
    shape: Shape, args: argparse.Namespace, server: Store, prefix: str, held: str, state: Path
) -> tuple[list[float], list[Stages], list[float], list[Stages]]:
    """One shape on a database and a `dagster dev` of its own: (a) and (b), each reaction printed as it is measured."""
    src, dst = kit.SOURCE, kit.DESTINATION
    work = state / shape.name
    flow, created = f"{prefix}-{shape.name}-flow", [f"{prefix}-{shape.name}-new{i}" for i in range(args.topics)]
    created_s: list[float] = []
    created_stages: list[Stages] = []
    resumed_s: list[float] = []
    resumed_stages: list[Stages] = []
    with common.fresh_database(server.engine, f"latency_{shape.name}") as url:
        store = Store(make_engine(url))
        env = {
            **StackEndpoints(src, dst, url).as_env(),
            **shape.env,
            **sitecustomize(work / "trace"),
            ENV_REPORT_SCHEDULE: "stopped",
        }
        traces = Traces(work / "trace")
        print(f"\n== shape {shape.name}: starting dagster dev ...", flush=True)
        try:
            with dagster_dev(env, work / "dagster-dev") as dev:
                print(f"dagster dev on {dev.url} (log: {dev.log})", flush=True)
                common.create_topic(dst, flow)
                common.create_topic(src, flow)
                properties = {
                    "name": CONNECTOR,
                    "connector.class": "com.salesforce.mirus.MirusSourceConnector",
                    "consumer.bootstrap.servers": src,
                    "destination.consumer.bootstrap.servers": dst,
                    "topics.regex": f"{re.escape(prefix)}-({held}|{shape.name}-.*)",
                }
                put = dev.client.submit_job_execution(
                    PUT_CONNECTOR_JOB, run_config={"ops": {STORE_CONNECTOR_OP: {"config": {"properties": properties}}}}
                )
                dev.wait_for_status(put, {"SUCCESS"}, timeout=120)
                traffic = Traffic(src, flow, rate=50)
                reader = destination_reader(dst, flow)
                try:
                    owner_run(dev, store, shape, timeout=600)
                    wait_until(lambda: reader.consume(1, 0.1), 120, 0, "the first copy of the flow")
                    print(f"connector {CONNECTOR!r} running, {args.held} idle partitions held", flush=True)
                    print(f"(a) new topic -> its first record at the destination, {args.topics} times", flush=True)
                    for i, topic in enumerate(created):
                        latency, stages = new_topic_latency(store, traces, topic)
                        created_s.append(latency)
                        created_stages.append(stages)
                        print(f"  topic {i + 1}: {latency:.2f} s  ({shown(stages)}; load {common.load_average():.1f})")
                    print(f"(b) kill -9 of the owner's run -> replicating (50 records/s), {args.kills} times")
                    for i in range(args.kills):
                        latency, stages, aside = kill_latency(dev, store, shape, traces, traffic, reader)
                        resumed_s.append(latency)
                        resumed_stages.append(stages)
                        load = common.load_average()
                        print(f"  kill {i + 1}: {latency:.2f} s  ({shown(stages)}; aside: {aside}; load {load:.1f})")
                    print(f"resident memory: {resident_memory(dev, store, shape)}", flush=True)
                finally:
                    traffic.stop()
                    reader.close()
        finally:
            store.engine.dispose()
            for bootstrap in (src, dst):
                with suppress(Exception):
                    common.delete_topics(bootstrap, [flow, *created])
    return created_s, created_stages, resumed_s, resumed_stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=10, help="new-topic repetitions (a)")
    parser.add_argument("--kills", type=int, default=10, help="kill -9 repetitions (b)")
    parser.add_argument("--held", type=int, default=1000, help="idle partitions the task holds meanwhile")
    parser.add_argument("--held-topics", type=int, default=10, help="topics the idle partitions are spread over")
    parser.add_argument("--shape", choices=["workers", "tasks", "both"], default="both", help="which process shapes")
    parser.add_argument("--workers", type=int, default=2, help="worker runs of the workers shape (owner and standby)")
    args = kit.parse_args(parser)
    chosen = shapes(args.workers)
    wanted = list(chosen) if args.shape == "both" else [args.shape]
    prefix = f"lat-{int(time.time())}"
    names = [f"{prefix}-held-{i:02d}" for i in range(args.held_topics if args.held else 0)]
    results = {}
    with (
        tempfile.TemporaryDirectory() as state,
        common.platform_database(name="latency") as server,
        held_topics(names, args.held // max(len(names), 1)),
    ):
        for name in wanted:
            results[name] = measure(chosen[name], args, server, prefix, "held-\\d+", Path(state))
    for name, (created_s, created_stages, resumed_s, resumed_stages) in results.items():
        print(f"\n{name}, {args.held} idle partitions held (stages: median time from the clock's start, median step)")
        summary("(a) new topic -> first copy", created_s, created_stages, TARGET_NEW_TOPIC_S)
        summary("(b) kill -9 -> replicating", resumed_s, resumed_stages, TARGET_KILL_S)


if __name__ == "__main__":
    main()
