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
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import common
from confluent_kafka import Message, Producer
from orchestration_latency import Traffic, destination_reader, first_record, report

from mirus.waiting import wait_until
from mirus_dagster.constants import ENV_DATABASE_URL
from replicator.configuration.connector import validate_submission
from replicator.discovery.watcher import MetadataWatcher, WatchRound
from replicator.state.database import make_engine, upgrade
from replicator.state.store import Store
from replicator.topics import provenance

PORTS = {"source_port": 29492, "destination_port": 29493, "postgres_port": 25652}


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
    return common.start_process(common.task_argv(connector), {**os.environ, ENV_DATABASE_URL: database_url}, log=log)


def standby_waiting(store: Store) -> bool:
    """A session waits on an advisory lock: the standby blocked on the owner's epoch lock (it waits again each
    `WAIT_S`)."""
    with store.engine.connect() as conn:
        for _ in range(30):
            if conn.exec_driver_sql("SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").first():
                return True
            time.sleep(0.05)
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connectors", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=10_000, help="source partitions over all connectors")
    parser.add_argument("--topics", type=int, default=10, help="new-topic repetitions (a)")
    parser.add_argument("--kills", type=int, default=10, help="kill -9 repetitions (b)")
    args = parser.parse_args()
    per_topic = args.partitions // args.connectors

    with tempfile.TemporaryDirectory() as state:
        stack = common.embedded_stack(Path(state), PORTS)
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
                common.create_topics(bootstrap, dict.fromkeys(names, per_topic), poll_s=0.2)
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
                f"{time.monotonic() - started:.1f} s (load {common.load_average():.1f})",
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
                commits_from = common.database_writes(store.engine)[0]
                print(f"\n(a) new topic -> first record at the destination, {args.topics} times", flush=True)
                created: list[float] = []
                for i in range(args.topics):
                    topic = f"{subject}-new{i}"
                    common.create_topic(dst, topic)
                    new_reader = destination_reader(dst, topic)
                    producer = Producer({"bootstrap.servers": src, "linger.ms": 0})
                    producer.list_topics(timeout=10)
                    clock = time.monotonic()
                    common.create_topic(src, topic)
                    producer.produce(topic, b"first", b"k", 0)
                    producer.flush(10)
                    created.append(first_record(new_reader, lambda msg: True, 60) - clock)
                    new_reader.close()
                    print(f"  topic {i + 1}: {created[-1]:.1f} s (load {common.load_average():.1f})", flush=True)

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
                    kill_point = traffic.acked_by(time.monotonic())

                    def after_kill(msg: Message, point: int = kill_point) -> bool:
                        origin = provenance.parse(msg.headers())
                        return origin is not None and origin.source_offset > point

                    resumed.append(first_record(reader, after_kill, 120) - clock)
                    print(f"  kill {i + 1}: {resumed[-1]:.1f} s (load {common.load_average():.1f})", flush=True)
                    processes.append(task_process(endpoints.database_url, subject, log))  # the next standby
                    wait_until(lambda: standby_waiting(store), 120, 0.05, "a new standby")
                watched = rounds.since(watched_from)
            finally:
                traffic.stop()
                reader.close()
                rounds.stop()
            elapsed = time.monotonic() - watched_from
            commits = common.database_writes(store.engine)[0] - commits_from
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
