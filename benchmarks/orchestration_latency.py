"""Orchestration latency under a real `dagster dev`: how fast the platform reacts, with default connector settings.

    python benchmarks/orchestration_latency.py [--topics 10] [--kills 10]

Starts a private embedded stack on ports 29192/29193/25532 (or MIRUS_SOURCE_PORT / MIRUS_DESTINATION_PORT /
MIRUS_POSTGRES_PORT; or uses MIRUS_SOURCE_BOOTSTRAP_SERVERS / MIRUS_DESTINATION_BOOTSTRAP_SERVERS /
MIRUS_DATABASE_URL) and `dagster dev` on the code location (the helper in
mirus/local/devserver.py), adds one connector through the GraphQL API with default settings (`topics.regex` only),
and measures:

(a) new topic → first copy: the destination topic is created, then the clock starts, the source topic matching
    the connector's `topics.regex` is created and one record is written to it; the clock stops when a consumer on
    the destination receives it. Path: the metadata watcher run (every second) sees the topic → new assignment
    generation → the running task picks it up (refreshing every second) and claims the partition → record copied.
(b) kill -9 → resumed replication: while a producer writes 50 records/s, the process of the run that owns the task
    (and its children) is killed; the clock stops at the first destination record whose source offset (from its
    `mirus.source` provenance header) is above the highest offset acknowledged at the source when the process was
    gone. Path: Postgres ends the dead process's session → the warm standby run, blocked on the owner's epoch
    lock, claims the next epoch → it creates its clients and resumes from the committed offsets. The supervisor
    starts a new standby meanwhile (not on the path).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mirus.local.devserver import DagsterDev, RunInfo, dagster_dev
from mirus.local.stack import LocalStack
from mirus.waiting import wait_until
from mirus_dagster.constants import (
    ENV_REPORT_SCHEDULE,
    PUT_CONNECTOR_JOB,
    REPLICATOR_JOB,
    STORE_CONNECTOR_OP,
    TAG_CONNECTOR,
    TAG_TASK,
    WATCHER_JOB,
)
from mirus_dagster.settings import PlatformSettings, StackEndpoints
from replicator.state.database import make_engine, upgrade
from replicator.state.store import Store
from replicator.topics import provenance

PORTS = {"source_port": 29192, "destination_port": 29193, "postgres_port": 25532}
TARGET_NEW_TOPIC_S = 2.0
TARGET_KILL_S = 3.0
CONNECTOR = "latency"
TAGS = {TAG_CONNECTOR: CONNECTOR, TAG_TASK: "0"}


def create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)
    wait_until(lambda: topic in admin.list_topics(timeout=5).topics, 30, 0.05, f"topic {topic} to be visible")


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


def first_record(
    consumer: Consumer,
    accept: Callable[[Message], object],
    timeout: float,
    seen: list[float] | None = None,
    seen_after: float = 0,
) -> float:
    """Poll until a record satisfying `accept` arrives; returns the monotonic time it was received. `seen` gets the
    time the first record of any kind arrived after `seen_after`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for msg in consumer.consume(100, 0.05):
            if msg.error() is None and seen is not None and not seen and time.monotonic() > seen_after:
                seen.append(time.monotonic())
            if msg.error() is None and accept(msg):
                return time.monotonic()
    raise RuntimeError(f"no matching record within {timeout:.0f}s")


def owner_run(dev: DagsterDev, store: Store, timeout: float = 120) -> RunInfo:
    """The started run that owns task 0, once its warm standby is standing by too."""

    def ready() -> RunInfo | None:
        live = {r.run_id: r for r in dev.runs(TAGS, job_name=REPLICATOR_JOB, statuses={"STARTED"})}
        lease = store.lease_of(CONNECTOR, 0)
        owner = lease.owner.rsplit(":", 1)[-1] if lease and lease.owner and lease.state == "RUNNING" else None
        return live[owner] if owner in live and len(live) >= 2 and standby_waiting(store) else None

    return dev.until(ready, timeout, "an owner run and a standby run standing by", interval=0.2)


def standby_waiting(store: Store) -> bool:
    """A session waits on an advisory lock: the standby blocked on the owner's epoch lock (it re-waits every 1 s)."""
    with store.engine.connect() as conn:
        for _ in range(30):
            if conn.exec_driver_sql("SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").first():
                return True
            time.sleep(0.05)
    return False


class Traffic:
    """A producer writing `rate` records/s to partition 0 of `topic`, remembering the highest acknowledged offset."""

    def __init__(self, bootstrap: str, topic: str, rate: float) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "enable.idempotence": True})
        self.topic, self.interval = topic, 1.0 / rate
        self.acked = -1
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _delivered(self, err: object, msg: Message) -> None:
        if err is None:
            self.acked = max(self.acked, msg.offset())

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

    def highest_acked(self) -> int:
        """Highest acknowledged offset, after serving every acknowledgement already received."""
        self.producer.poll(0)
        return self.acked

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(60)
        del self.producer  # its broker connections close now, not when the stack is already down


def new_topic_latency(dev: DagsterDev, store: Store, endpoints: StackEndpoints, topic: str) -> tuple[float, str]:
    src, dst = endpoints.source_bootstrap_servers, endpoints.destination_bootstrap_servers
    create_topic(dst, topic)
    reader = destination_reader(dst, topic)
    producer = Producer({"bootstrap.servers": src, "linger.ms": 0})
    producer.list_topics(timeout=10)  # connected before the clock starts
    try:
        started, started_wall = time.monotonic(), time.time()
        create_topic(src, topic)
        producer.produce(topic, b"first", b"k", 0)
        producer.flush(10)
        latency = first_record(reader, lambda msg: True, 60) - started
    finally:
        reader.close()
    with store.engine.connect() as conn:
        assigned = conn.exec_driver_sql(
            "SELECT extract(epoch FROM min(created_at)) FROM assignments WHERE connector = %(c)s AND partitions @> "
            "%(p)s::jsonb",
            {"c": CONNECTOR, "p": f'[["{topic}", 0]]'},
        ).scalar()
        claimed = conn.exec_driver_sql(
            "SELECT extract(epoch FROM updated_at) FROM partition_status WHERE connector = %(c)s AND topic = %(t)s",
            {"c": CONNECTOR, "t": topic},
        ).scalar()
    breakdown = (
        f"topic visible + generation written by the watcher +{float(assigned) - started_wall:.1f}s, "
        f"partition claimed by the running task +{float(claimed) - started_wall:.1f}s"
    )
    return latency, breakdown


def kill_latency(dev: DagsterDev, store: Store, traffic: Traffic, reader: Consumer) -> tuple[float, str]:
    """Kill the owner run's worker; seconds until a record produced after the kill is copied, and a breakdown."""
    victim = owner_run(dev, store)
    lease = store.lease_of(CONNECTOR, 0)
    assert lease is not None, "owner_run returned a run that holds no lease"
    epoch = lease.epoch
    while reader.consume(1000, 0):
        pass  # copies made before the kill
    killed = dev.kill_run_worker(victim.run_id)  # returns once the worker and its children are gone
    killed_at, killed_wall = killed.monotonic, killed.at  # the clock starts when SIGKILL was sent
    # Everything acknowledged at the source by now may have been read by the dead process; what comes later not.
    kill_point = traffic.highest_acked()

    def after_kill(msg: Message) -> bool:
        origin = provenance.parse(msg.headers())
        return origin is not None and origin.source_offset > kill_point

    first_copy: list[float] = []  # the dead owner's last produce requests are answered within milliseconds
    latency = first_record(reader, after_kill, 120, first_copy, killed_at + 0.1) - killed_at
    lease = store.lease_of(CONNECTOR, 0)
    assert lease is not None and lease.claimed_at is not None and lease.epoch > epoch
    taker = lease.owner.rsplit(":", 1)[-1] if lease.owner else "?"
    failed = dev.wait_for_status(victim.run_id, {"FAILURE"}, timeout=30)
    (new,) = dev.wait_for_runs(
        TAGS, statuses={"STARTED"}, where=lambda r: r.creation_time > killed_wall, job_name=REPLICATOR_JOB, timeout=240
    )
    breakdown = (
        f"standby {taker[:8]} claimed epoch {lease.epoch} +{lease.claimed_at.timestamp() - killed_wall:.2f}s, "
        f"first copy (replay of what the dead owner had not committed) +{first_copy[0] - killed_at:.1f}s; "
        f"off the path: run FAILURE +{(failed.end_time or killed_wall) - killed_wall:.1f}s, new standby run "
        f"requested +{new.creation_time - killed_wall:.1f}s ({new.tags.get('dagster/sensor_name')}), "
        f"started +{(new.start_time or killed_wall) - killed_wall:.1f}s"
    )
    return latency, breakdown


def benchmark_stack(state: Path, ports: dict[str, int]) -> LocalStack:
    """The embedded stack on `ports`, except for ports and parts the environment gives (MIRUS_*)."""
    ports = {name: port for name, port in ports.items() if f"MIRUS_{name.upper()}" not in os.environ}
    return LocalStack(PlatformSettings.from_env().model_copy(update={"state_dir": state, **ports}))


def resident_memory(dev: DagsterDev, store: Store) -> str:
    """Resident memory of the owner, standby and watcher run processes (each with its children)."""
    owner = owner_run(dev, store)
    standby = [r for r in dev.runs(TAGS, job_name=REPLICATOR_JOB, statuses={"STARTED"}) if r.run_id != owner.run_id]
    watcher = dev.runs(job_name=WATCHER_JOB, statuses={"STARTED"})
    shown = []
    for label, runs in (("owner", [owner]), ("standby", standby[:1]), ("watcher", watcher[:1])):
        worker = dev.run_worker(runs[0].run_id) if runs else None
        if worker is not None:
            rss = sum(p.memory_info().rss for p in [worker, *worker.children(recursive=True)])
            shown.append(f"{label} {rss / 2**20:.0f} MB")
    return ", ".join(shown)


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def report(label: str, values: list[float], target: float) -> None:
    median = statistics.median(values)
    verdict = "met" if median <= target else "NOT MET"
    print(f"{label}: median {median:.1f} s (target <= {target:.0f} s: {verdict}); max {max(values):.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=10, help="new-topic repetitions (a)")
    parser.add_argument("--kills", type=int, default=10, help="kill -9 repetitions (b)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as state:
        stack = benchmark_stack(Path(state), PORTS)
        endpoints = stack.up()
        store = Store(make_engine(endpoints.database_url))
        try:
            upgrade(store.engine)
            src, dst = endpoints.source_bootstrap_servers, endpoints.destination_bootstrap_servers
            prefix = f"lat-{int(time.time())}"
            print("starting dagster dev ...", flush=True)
            with dagster_dev(
                {**endpoints.as_env(), ENV_REPORT_SCHEDULE: "stopped"}, Path(state) / "dagster-dev"
            ) as dev:
                print(f"dagster dev on {dev.url} (log: {dev.log})", flush=True)
                flow = f"{prefix}-flow"
                create_topic(dst, flow)
                create_topic(src, flow)
                properties = {
                    "name": CONNECTOR,
                    "connector.class": "com.salesforce.mirus.MirusSourceConnector",
                    "consumer.bootstrap.servers": src,
                    "destination.consumer.bootstrap.servers": dst,
                    "topics.regex": f"{prefix}-.*",
                }
                put = dev.client.submit_job_execution(
                    PUT_CONNECTOR_JOB, run_config={"ops": {STORE_CONNECTOR_OP: {"config": {"properties": properties}}}}
                )
                dev.wait_for_status(put, {"SUCCESS"}, timeout=120)
                traffic = Traffic(src, flow, rate=50)
                reader = destination_reader(dst, flow)
                try:
                    owner_run(dev, store)
                    first_record(reader, lambda msg: True, 120)  # the connector is running and copying
                    print(f"connector {CONNECTOR!r} running (default settings, topics.regex {prefix}-.*)", flush=True)

                    print(f"\n(a) new topic -> first record at the destination, {args.topics} times", flush=True)
                    created: list[float] = []
                    for i in range(args.topics):
                        latency, breakdown = new_topic_latency(dev, store, endpoints, f"{prefix}-new{i}")
                        created.append(latency)
                        print(f"  topic {i + 1}: {latency:.1f} s  ({breakdown}; load {load()})", flush=True)

                    print(
                        f"\n(b) kill -9 of the replicator run -> resumed replication (50 records/s), "
                        f"{args.kills} times",
                        flush=True,
                    )
                    resumed: list[float] = []
                    for i in range(args.kills):
                        latency, breakdown = kill_latency(dev, store, traffic, reader)
                        resumed.append(latency)
                        print(f"  kill {i + 1}: {latency:.1f} s  ({breakdown}; load {load()})", flush=True)
                    print(f"\nresident memory: {resident_memory(dev, store)}", flush=True)
                finally:
                    traffic.stop()
                    reader.close()
                print()
                report("(a) new topic -> first record", created, TARGET_NEW_TOPIC_S)
                report("(b) kill -9 -> resumed replication", resumed, TARGET_KILL_S)
        finally:
            store.engine.dispose()
            stack.down()


if __name__ == "__main__":
    main()
