"""Discovery and takeover at scale: 100 connectors over 10,000 partitions watched by one metadata watcher.

    python benchmarks/discovery_scale.py [--connectors 100] [--partitions 10000] [--topics 10] [--kills 10]

Starts a private embedded stack on ports 29492/29493/25652 (or MIRUS_SOURCE_PORT / MIRUS_DESTINATION_PORT /
MIRUS_POSTGRES_PORT; or uses MIRUS_SOURCE_BOOTSTRAP_SERVERS / MIRUS_DESTINATION_BOOTSTRAP_SERVERS /
MIRUS_DATABASE_URL). Creates one topic per connector on both clusters (partitions / connectors partitions each),
stores the connectors (`topics.regex` = their topic and its `-new*` siblings, default settings otherwise) and
runs the metadata watcher (`replicator/discovery/watcher.py`, as the `metadata_watcher` run does) in this process, then:

(a) new topic → first copy for connector 0, while the watcher keeps watching all connectors;
(b) kill -9 of connector 0's owner process → first copy of a record produced after the kill, with a warm standby
    (`mirus task run`, the same code as the replicator run without Dagster's process start).

It prints the watcher's round time and the metadata requests per second it sends to each cluster. Only connector
0's task runs: 100 owner + 100 standby processes do not fit on a 2-core machine, and other connectors' tasks
do not change what the watcher does.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from confluent_kafka import Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.orchestration_latency import (
    Traffic,
    benchmark_stack,
    destination_reader,
    first_record,
    load,
    report,
    standby_waiting,
)
from mirus.waiting import wait_until
from mirus_dagster.constants import ENV_DATABASE_URL
from replicator.configuration.connector import validate_submission
from replicator.discovery.watcher import MetadataWatcher, WatchRound
from replicator.state.database import make_engine, upgrade
from replicator.state.store import Store
from replicator.topics import provenance

PORTS = {"source_port": 29492, "destination_port": 29493, "postgres_port": 25652}


def create_topics(bootstrap: str, topics: dict[str, int]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = list(topics)
    for i in range(0, len(names), 20):
        batch = names[i : i + 20]
        for future in admin.create_topics([NewTopic(t, topics[t], 1) for t in batch]).values():
            future.result(timeout=120)
    wait_until(lambda: set(names) <= set(admin.list_topics(timeout=30).topics), 120, 0.2, "the topics to be visible")


class Rounds:
    """The watcher's rounds, recorded as they happen (in its own thread)."""

    def __init__(self, watcher: MetadataWatcher) -> None:
        self.rounds: list[tuple[float, WatchRound]] = []
        self.watcher = watcher
        self.stopped = threading.Event()
        watch_once = watcher.watch_once

        def recorded() -> WatchRound:
            done = watch_once()
            self.rounds.append((time.monotonic(), done))
            return done

        # Deliberate: this watcher's method is wrapped to record its rounds; mypy refuses assigning to a method.
        watcher.watch_once = recorded  # type: ignore[method-assign]
        self.thread = threading.Thread(target=watcher.run, args=(self.stopped.is_set,), daemon=True)
        self.thread.start()

    def since(self, at: float) -> list[WatchRound]:
        return [r for t, r in self.rounds if t >= at]

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(60)


def task_process(database_url: str, connector: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, ENV_DATABASE_URL: database_url}
    argv = [sys.executable, "-c", "from mirus.cli.main import main; main()", "task", "run", connector, "0"]
    return subprocess.Popen(argv, env=env, stdout=log.open("a"), stderr=subprocess.STDOUT)


def committed_transactions(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.scalar(text("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connectors", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=10_000, help="source partitions over all connectors")
    parser.add_argument("--topics", type=int, default=10, help="new-topic repetitions (a)")
    parser.add_argument("--kills", type=int, default=10, help="kill -9 repetitions (b)")
    args = parser.parse_args()
    per_topic = args.partitions // args.connectors

    with tempfile.TemporaryDirectory() as state:
        stack = benchmark_stack(Path(state), PORTS)
        endpoints = stack.up()
        store = Store(make_engine(endpoints.database_url))
        processes: list[subprocess.Popen[bytes]] = []
        try:
            upgrade(store.engine)
            src, dst = endpoints.source_bootstrap_servers, endpoints.destination_bootstrap_servers
            prefix = f"scale-{int(time.time())}"
            names = [f"{prefix}-{i:03d}" for i in range(args.connectors)]
            print(f"creating {args.connectors} topics x {per_topic} partitions on both clusters ...", flush=True)
            for bootstrap in (src, dst):
                create_topics(bootstrap, {name: per_topic for name in names})
            for name in names:
                config = validate_submission(
                    {
                        "name": name,
                        "connector.class": "com.salesforce.mirus.MirusSourceConnector",
                        "consumer.bootstrap.servers": src,
                        "destination.consumer.bootstrap.servers": dst,
                        "topics.regex": f"{name}(-new.*)?",
                    }
                )
                store.put_connector(config.name, config.raw, config.tasks_max)
            watcher = MetadataWatcher(store)
            started = time.monotonic()
            rounds = Rounds(watcher)
            wait_until(lambda: all(store.read_assignment(n) for n in names), 600, 0.05, "every connector assigned")
            print(
                f"first assignment of {args.connectors} connectors / {per_topic * args.connectors} partitions: "
                f"{time.monotonic() - started:.1f} s (load {load()})",
                flush=True,
            )

            subject = names[0]
            log = Path(state) / "tasks.log"
            processes.append(task_process(endpoints.database_url, subject, log))
            traffic = Traffic(src, subject, rate=50)
            reader = destination_reader(dst, subject)
            try:
                first_record(reader, lambda msg: True, 120)
                processes.append(task_process(endpoints.database_url, subject, log))
                wait_until(lambda: standby_waiting(store), 120, 0.05, "a standby")
                print(
                    f"connector {subject} replicating ({per_topic} partitions), owner and standby processes", flush=True
                )

                watched_from = time.monotonic()
                commits_from = committed_transactions(store)
                print(f"\n(a) new topic -> first record at the destination, {args.topics} times", flush=True)
                created: list[float] = []
                for i in range(args.topics):
                    topic = f"{subject}-new{i}"
                    create_topics(dst, {topic: 1})
                    new_reader = destination_reader(dst, topic)
                    producer = Producer({"bootstrap.servers": src, "linger.ms": 0})
                    producer.list_topics(timeout=10)
                    clock = time.monotonic()
                    create_topics(src, {topic: 1})
                    producer.produce(topic, b"first", b"k", 0)
                    producer.flush(10)
                    created.append(first_record(new_reader, lambda msg: True, 60) - clock)
                    new_reader.close()
                    print(f"  topic {i + 1}: {created[-1]:.1f} s (load {load()})", flush=True)

                print(f"\n(b) kill -9 of the owner process -> resumed replication, {args.kills} times", flush=True)
                resumed: list[float] = []
                for i in range(args.kills):
                    lease = store.lease_of(subject, 0)
                    assert lease is not None and lease.owner is not None
                    owner_pid = int(lease.owner.split(":")[1])
                    victim = next(p for p in processes if p.pid == owner_pid)
                    clock = time.monotonic()
                    victim.send_signal(signal.SIGKILL)
                    victim.wait(10)
                    kill_point = traffic.highest_acked()

                    def after_kill(msg: Message, point: int = kill_point) -> bool:
                        origin = provenance.parse(msg.headers())
                        return origin is not None and origin.source_offset > point

                    resumed.append(first_record(reader, after_kill, 120) - clock)
                    print(f"  kill {i + 1}: {resumed[-1]:.1f} s (load {load()})", flush=True)
                    processes.append(task_process(endpoints.database_url, subject, log))  # the next standby
                    wait_until(lambda: standby_waiting(store), 120, 0.05, "a new standby")
                watched = rounds.since(watched_from)
            finally:
                traffic.stop()
                reader.close()
                rounds.stop()
            elapsed = time.monotonic() - watched_from
            commits = committed_transactions(store) - commits_from
            requests: Counter[str] = Counter()
            for r in watched:
                requests.update(r.requests)
            seconds = [r.seconds for r in watched]
            print(
                f"\nwatcher: {len(watched)} rounds in {elapsed:.0f} s over {args.connectors} connectors; round "
                f"median {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s; connectors polled (a "
                f"change seen) {sum(len(r.polled) for r in watched)}"
            )
            for cluster, count in sorted(requests.items()):
                print(f"  metadata requests to {cluster}: {count / elapsed:.2f}/s")
            print(
                f"  Postgres transactions committed: {commits / elapsed:.1f}/s (the watcher, connector 0's owner and "
                "standby, this script's checks)"
            )
            print()
            report("(a) new topic -> first record", created, 2.0)
            report("(b) kill -9 -> resumed replication", resumed, 3.0)
        finally:
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGINT)
                    process.wait(30)
            store.engine.dispose()
            stack.down()


if __name__ == "__main__":
    main()
