"""Orchestration latency under a real `dagster dev`: how fast the platform reacts, with default connector settings.

    python benchmarks/orchestration_latency.py [--topics 10] [--kills 10] [--held 1000] [--shape tasks|workers]

Starts a private embedded stack on ports 29192/29193/25532 (or MIRUS_SOURCE_PORT / MIRUS_DESTINATION_PORT /
MIRUS_POSTGRES_PORT; or uses MIRUS_SOURCE_BOOTSTRAP_SERVERS / MIRUS_DESTINATION_BOOTSTRAP_SERVERS /
MIRUS_DATABASE_URL) and `dagster dev` on the code location (the helper in
mirus/local/devserver.py), adds one connector through the GraphQL API with default settings (`topics.regex` only),
and measures:

(a) new topic → first copy: the clock starts, the source topic matching the connector's `topics.regex` is created
    and one record is written to it; the clock stops when the destination partition's high watermark says the copy
    is there. Path: the metadata watcher run (a round every 0.5 s) sees the topic → asks the destination for the
    topic (created by the platform, `topic.creation.enable`; `--precreated` creates it before the clock starts
    instead) → collects the creation, writes a new assignment generation → the running task picks it up (reading its
    connector's row every 0.5 s) and claims the partition → record copied.
The connector also holds `--held` idle partitions (one topic of that many partitions it matches) from the start,
so every reaction happens in a task that has them. `--shape tasks` runs a Dagster run per task (an owner and a warm
standby run); `--shape workers` sets MIRUS_REPLICATOR_WORKERS=2, so the task's owner and standby are copies in two
worker runs.

(b) kill -9 → resumed replication: while a producer writes 50 records/s, the process of the run that owns the task
    (and its children) is killed; the clock stops at the first destination record whose source offset (from its
    `mirus.source` provenance header) is above the highest offset acknowledged at the source by the kill (+50 ms),
    as a reader on a thread of its own sees it (the wait until psutil sees the dead processes reaped, which their
    parent does when it gets to it, is not on the clock). Path: Postgres ends the dead process's session → the warm
    standby (its run blocked on the owner's epoch lock; in a worker, asking with the worker's other standbys every
    0.2 s) claims the next epoch → it creates its clients and resumes from the committed offsets. The supervisor
    starts a new standby meanwhile (not on the path).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import common
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from mirus.local.devserver import LOGS_QUERY, DagsterDev, RunInfo, dagster_dev
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
from replicator.state.database import make_engine, upgrade
from replicator.state.store import Store
from replicator.topics import provenance

PORTS = {"source_port": 29192, "destination_port": 29193, "postgres_port": 25532}
TARGET_NEW_TOPIC_S = 1.0
TARGET_KILL_S = 1.0
ACK_MARGIN_S = 0.05
CONNECTOR = "latency"
TAGS = {TAG_CONNECTOR: CONNECTOR, TAG_TASK: "0"}
WORKERS = 2  # --shape workers: the task's owner and its standby in two worker runs


@dataclass(frozen=True)
class Shape:
    """Where the task runs: `job`'s runs matching `tags` (the run per task, or every worker run)."""

    name: str
    job: str
    tags: dict[str, str]
    env: dict[str, str]


SHAPES = {
    "tasks": Shape("tasks", REPLICATOR_JOB, TAGS, {ENV_REPLICATOR_WORKERS: "0"}),
    "workers": Shape("workers", WORKER_JOB, {}, {ENV_REPLICATOR_WORKERS: str(WORKERS)}),
}


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
        del self.producer  # its broker connections close now, not when the stack is already down


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


def _high_watermark(consumer: Consumer, topic: str) -> int:
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=2, cached=False)[1])
    except KafkaException:  # not known to this client yet
        return -1


def _has_leader(admin: AdminClient, topic: str) -> bool:
    partitions = admin.list_topics(topic, timeout=5).topics[topic].partitions
    return 0 in partitions and partitions[0].leader >= 0


def new_topic_latency(
    dev: DagsterDev, store: Store, shape: Shape, endpoints: StackEndpoints, topic: str, precreated: bool
) -> tuple[float, str]:
    src, dst = endpoints.source_bootstrap_servers, endpoints.destination_bootstrap_servers
    if precreated:
        common.create_topic(dst, topic)
    producer = Producer({"bootstrap.servers": src, "linger.ms": 0})
    producer.list_topics(timeout=10)  # connected before the clock starts
    looker = AdminClient({"bootstrap.servers": dst})
    looker.list_topics(timeout=10)
    ends = Consumer({"bootstrap.servers": dst, "group.id": "bench-latency"})
    ends.list_topics(timeout=10)
    try:
        started, started_wall = time.monotonic(), time.time()
        common.create_topic(src, topic)
        producer.produce(topic, b"first", b"k", 0)
        producer.flush(10)
        # The platform creates the destination topic (topic.creation.enable, the default) ...
        wait_until(lambda: _has_leader(looker, topic), 60, 0.005, f"destination topic {topic}")
        created = time.monotonic() - started
        # ... and the clock stops when the destination's log holds the copy (its high watermark, asked every 5 ms:
        # no consumer's start-up or fetch wait is counted).
        wait_until(lambda: _high_watermark(ends, topic) >= 1, 60, 0.005, f"the copy in {topic}")
        latency = time.monotonic() - started
    finally:
        ends.close()
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
    replicating = event_time(dev, owner_run(dev, store, shape), f"replicating 1 partition(s): {topic}")
    breakdown = (
        f"{'' if precreated else f'destination topic created +{created:.2f}s, '}"
        f"topic visible + generation written by the watcher +{float(assigned) - started_wall:.2f}s, "
        f"partition claimed by the running task +{float(claimed) - started_wall:.2f}s, "
        f"its start done +{replicating - started_wall:.2f}s"
    )
    return latency, breakdown


def event_time(dev: DagsterDev, run: RunInfo, text: str) -> float:
    """When the run's event log got its last message containing `text` (wall clock)."""
    found, cursor = 0.0, None
    while True:
        data = dev.query(LOGS_QUERY, {"runId": run.run_id, "afterCursor": cursor})["logsForRun"]
        for event in data["events"]:
            if text in (event.get("message") or ""):
                found = int(event["timestamp"]) / 1000
        if not data["hasMore"] or data["cursor"] == cursor:
            return found
        cursor = data["cursor"]


def kill_latency(dev: DagsterDev, store: Store, shape: Shape, traffic: Traffic, reader: Consumer) -> tuple[float, str]:
    """Kill the owner run's process; seconds until a record produced after the kill is copied, and a breakdown."""
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
    taker = lease.owner.rsplit(":", 1)[-1] if lease.owner else "?"
    failed = dev.wait_for_status(victim.run_id, {"FAILURE"}, timeout=30)
    (new,) = dev.wait_for_runs(
        shape.tags, statuses={"STARTED"}, where=lambda r: r.creation_time > killed_wall, job_name=shape.job, timeout=240
    )
    breakdown = (
        f"standby {taker[:8]} claimed epoch {lease.epoch} +{lease.claimed_at.timestamp() - killed_wall:.2f}s, "
        f"first copy (replay of what the dead owner had not committed) +{first_copy - killed_at:.2f}s; "
        f"off the path: dead processes reaped +{gone_s:.2f}s, "
        f"run FAILURE +{(failed.end_time or killed_wall) - killed_wall:.1f}s, new standby run "
        f"requested +{new.creation_time - killed_wall:.1f}s ({new.tags.get('dagster/sensor_name')}), "
        f"started +{(new.start_time or killed_wall) - killed_wall:.1f}s"
    )
    return latency, breakdown


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


def report(label: str, values: list[float], target: float) -> None:
    median = statistics.median(values)
    verdict = "met" if median <= target else "NOT MET"
    print(f"{label}: median {median:.2f} s (target <= {target:.0f} s: {verdict}); max {max(values):.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=10, help="new-topic repetitions (a)")
    parser.add_argument("--kills", type=int, default=10, help="kill -9 repetitions (b)")
    parser.add_argument("--held", type=int, default=1000, help="idle partitions the task holds meanwhile")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tasks", help="a run per task, or worker runs")
    parser.add_argument(
        "--precreated", action="store_true", help="(a): create each destination topic first, not by the platform"
    )
    args = parser.parse_args()
    shape = SHAPES[args.shape]

    with tempfile.TemporaryDirectory() as state:
        stack = common.embedded_stack(Path(state), PORTS)
        endpoints = stack.up()
        store = Store(make_engine(endpoints.database_url))
        try:
            upgrade(store.engine)
            src, dst = endpoints.source_bootstrap_servers, endpoints.destination_bootstrap_servers
            prefix = f"lat-{int(time.time())}"
            print("starting dagster dev ...", flush=True)
            with dagster_dev(
                {**endpoints.as_env(), **shape.env, ENV_REPORT_SCHEDULE: "stopped"}, Path(state) / "dagster-dev"
            ) as dev:
                print(f"dagster dev on {dev.url} (log: {dev.log})", flush=True)
                flow = f"{prefix}-flow"
                common.create_topic(dst, flow)
                common.create_topic(src, flow)
                if args.held:
                    common.create_topic(dst, f"{prefix}-held", args.held)
                    common.create_topic(src, f"{prefix}-held", args.held)
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
                    owner_run(dev, store, shape)
                    first_record(reader, lambda msg: True, 120)  # the connector is running and copying
                    print(
                        f"connector {CONNECTOR!r} running (default settings, topics.regex {prefix}-.*, "
                        f"{args.held} idle partitions held; shape: {shape.name})",
                        flush=True,
                    )

                    print(f"\n(a) new topic -> first record at the destination, {args.topics} times", flush=True)
                    created: list[float] = []
                    for i in range(args.topics):
                        latency, breakdown = new_topic_latency(
                            dev, store, shape, endpoints, f"{prefix}-new{i}", args.precreated
                        )
                        created.append(latency)
                        print(
                            f"  topic {i + 1}: {latency:.2f} s  ({breakdown}; load {common.load_average():.1f})",
                            flush=True,
                        )

                    print(
                        f"\n(b) kill -9 of the replicator run -> resumed replication (50 records/s), "
                        f"{args.kills} times",
                        flush=True,
                    )
                    resumed: list[float] = []
                    for i in range(args.kills):
                        latency, breakdown = kill_latency(dev, store, shape, traffic, reader)
                        resumed.append(latency)
                        print(
                            f"  kill {i + 1}: {latency:.2f} s  ({breakdown}; load {common.load_average():.1f})",
                            flush=True,
                        )
                    print(f"\nresident memory: {resident_memory(dev, store, shape)}", flush=True)
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
