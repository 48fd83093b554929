"""Copiers on two real Apache Kafka clusters, for the benchmarks that compare the engine with MirrorMaker 1.0.

The clusters and MirrorMaker come from a kit directory (`--kit`, default `$MIRUS_KAFKA_KIT` or
`/work/shared/apache-kafka`) with `start.sh`, `preload.sh` and `mirrormaker.sh`: cluster a on 127.0.0.1:39092 is
the source, cluster b on 127.0.0.1:49092 the destination. Postgres is the embedded one (or `MIRUS_DATABASE_URL`).

Every copier runs as its own process, so its CPU time is its own (`os.wait4`), start-up included:
- `mirrormaker`: Apache MirrorMaker 1.0 (`mirrormaker.sh TOPIC`, copying TOPIC to the same name on b);
- `naive`: the tuned consume→produce loop below (this file run with `naive ...`);
- `engine`: `mirus task run CONNECTOR TASK`, one process per task, default connector settings.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mirus.local.stack import LocalStack  # noqa: E402
from mirus.waiting import wait_until  # noqa: E402
from mirus_dagster.settings import PlatformSettings  # noqa: E402
from replicator.configuration.connector import validate_submission  # noqa: E402
from replicator.state.database import make_engine, upgrade  # noqa: E402
from replicator.state.store import Store  # noqa: E402

# The kit's clusters, or others named as the suite names them (e.g. the second kit on 39192/49192).
SOURCE = os.environ.get("MIRUS_SOURCE_BOOTSTRAP_SERVERS", "127.0.0.1:39092")
DESTINATION = os.environ.get("MIRUS_DESTINATION_BOOTSTRAP_SERVERS", "127.0.0.1:49092")
KIT = Path(os.environ.get("MIRUS_KAFKA_KIT", "/work/shared/apache-kafka"))
MIRUS = [sys.executable, "-c", "from mirus.cli.main import main; main()"]


@dataclass
class Run:
    copier: str
    wall_s: float
    cpu_s: float
    load: float  # 1-minute load average when the run started


def parse_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The command line, once the clusters are known to be up (exits with a hint otherwise)."""
    args = parser.parse_args()
    if not kit_is_up():
        sys.exit(f"Apache Kafka is not running on {SOURCE} and {DESTINATION}: start the kit first")
    return args


def kit_is_up() -> bool:
    try:
        for bootstrap in (SOURCE, DESTINATION):
            AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=3)
    except Exception:
        return False
    return True


def preload(topic: str, records: int, partitions: int) -> None:
    """`records` 100-byte records into `topic` on cluster a, written by Kafka's own ProducerPerformance (the
    kit's script knows only its own ports: another source is filled by a confluent-kafka producer)."""
    if SOURCE != "127.0.0.1:39092":
        create_topic(SOURCE, topic, partitions)
        load(SOURCE, topic, records, partitions, 100)
        return
    subprocess.run([str(KIT / "preload.sh"), str(records), topic, str(partitions)], check=True, capture_output=True)


def load(bootstrap: str, topic: str, records: int, partitions: int, size: int) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 500000,
        }
    )
    value = b"x" * size
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush()


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    while topic not in admin.list_topics(timeout=5).topics:
        time.sleep(0.05)


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(topics).values():
        future.result(120)  # Kafka 1.0 takes long to delete thousands of partitions


def destination_count(counter: Consumer, topic: str, partitions: int) -> int:
    """Records at the destination (Apache Kafka's high watermarks are exact)."""
    return sum(counter.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1] for p in range(partitions))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def platform_database(migrate: bool = True, name: str = "bench") -> Iterator[Store]:
    """A private embedded Postgres (or `MIRUS_DATABASE_URL`), at this checkout's schema unless `migrate` is False."""
    settings = PlatformSettings.from_env()
    if settings.database_url:
        engine = make_engine(settings.database_url)
        upgrade(engine)
        yield Store(engine)
        return
    state = Path(os.environ.get("TMPDIR", "/tmp")) / f"mirus-{name}-{os.getpid()}"
    stack = LocalStack(
        settings.model_copy(
            update={
                "state_dir": state,
                "source_bootstrap_servers": SOURCE,
                "destination_bootstrap_servers": DESTINATION,
                "postgres_port": free_port(),
            }
        )
    )
    endpoints = stack.up()
    try:
        engine = make_engine(endpoints.database_url)
        if migrate:
            upgrade(engine)
        yield Store(engine)
        engine.dispose()
    finally:
        stack.down()


def put_engine_connector(
    store: Store, name: str, topic: str, suffix: str, partitions: int, tasks: int, **extra: object
) -> None:
    """A connector with default settings copying `topic` to `topic + suffix`, its partitions spread over tasks."""
    config = validate_submission(
        {
            "name": name,
            "consumer.bootstrap.servers": SOURCE,
            "destination.consumer.bootstrap.servers": DESTINATION,
            "topics.whitelist": topic,
            "destination.topic.name.suffix": suffix,
            "tasks.max": tasks,
            **extra,
        }
    )
    store.put_connector(name, config.raw, tasks)
    store.write_assignment(name, {t: [(topic, p) for p in range(partitions) if p % tasks == t] for t in range(tasks)})


@contextmanager
def baseline_database(name: str) -> Iterator[str]:
    """A database of its own for the engine of another checkout (`engine-baseline`): its schema may be older than
    this checkout's, so that checkout's own code migrates it and stores its connectors (`put_baseline_connector`).
    Yields its URL."""
    with platform_database(migrate=False, name=f"baseline-{name}") as store:
        yield store.engine.url.render_as_string(hide_password=False)


def put_baseline_connector(checkout: str, url: str, *args: object) -> None:
    """`put_engine_connector` run by `checkout`'s own benchmark helpers against its database at `url`."""
    program = (
        f"import sys; sys.path.insert(0, {str(Path(checkout) / 'benchmarks')!r}); import apache_kafka as kit; "
        f"engine = kit.make_engine({url!r}); kit.upgrade(engine); "
        f"kit.put_engine_connector(kit.Store(engine), *{args!r})"
    )
    subprocess.run(["env", f"PYTHONPATH={checkout}", sys.executable, "-P", "-c", program], check=True)


def baseline_argvs(checkout: str, argvs: list[list[str]], url: str) -> list[list[str]]:
    """`argvs` run on `checkout`'s engine and database (-P: `python -c` would put the working directory, this
    checkout, ahead of PYTHONPATH)."""
    return [["env", f"PYTHONPATH={checkout}", f"MIRUS_DATABASE_URL={url}", a[0], "-P", *a[1:]] for a in argvs]


def engine_argv(name: str, tasks: int) -> list[list[str]]:
    return [[*MIRUS, "task", "run", name, str(t)] for t in range(tasks)]


def mirrormaker_argv(topic: str) -> list[list[str]]:
    return [[str(KIT / "mirrormaker.sh"), topic]]


def naive_argv(topic: str, target: str, records: int, partitions: int) -> list[list[str]]:
    return [[sys.executable, __file__, "naive", topic, target, str(records), str(partitions)]]


def start_process(argv: list[str], env: dict[str, str], niceness: int = 0) -> subprocess.Popen[bytes]:
    """A copier (or load) process at `niceness` (copiers at the default 0, whatever this process runs at)."""

    def prepare() -> None:
        # A shell may have started us with SIGINT ignored, which the child would inherit: give it back its default.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.setpriority(os.PRIO_PROCESS, 0, niceness)

    return subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=prepare
    )


def timed_copy(
    copier: str,
    argvs: list[list[str]],
    target: str,
    partitions: int,
    records: int,
    env: dict[str, str],
    stop_signal: int = signal.SIGINT,
    timeout_s: float = 300.0,
    copied: Callable[[], int] | None = None,
) -> Run:
    """Start the copier's processes; wall = start until `target` holds `records` (or `copied()` reaches it: a
    transactional copy's commit markers count in high watermarks); CPU-s of all its processes."""
    counter = Consumer({"bootstrap.servers": DESTINATION, "group.id": "bench-counter"})
    count = copied or (lambda: destination_count(counter, target, partitions))
    load = os.getloadavg()[0]

    def copied_all() -> bool:
        if count() >= records:
            return True
        if any(p.poll() is not None and p.returncode != 0 for p in procs):
            raise RuntimeError(f"{copier} exited with {[p.returncode for p in procs]}")
        return False

    start = time.perf_counter()
    procs = [start_process(argv, env) for argv in argvs]
    try:
        wait_until(copied_all, timeout_s, 0.02, f"{copier}: all {records} records at {target}")
        wall = time.perf_counter() - start
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(stop_signal)
        counter.close()
    cpu = 0.0
    for p in procs:
        _pid, _status, usage = os.wait4(p.pid, 0)
        p.returncode = 0  # reaped here; keep Popen from waiting again
        cpu += usage.ru_utime + usage.ru_stime
    return Run(copier, wall, cpu, load)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def naive_copy(source: str, destination: str, topic: str, target: str, records: int, partitions: int) -> None:
    """A hand-written copier tuned as a user would tune it (no offsets, metrics or headers; flush at the end)."""
    consumer = Consumer(
        {
            "bootstrap.servers": source,
            "group.id": "bench-naive",
            "enable.auto.commit": False,
            "fetch.max.bytes": 50 * 1024 * 1024,
            "queued.min.messages": 200_000,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    producer = Producer(
        {
            "bootstrap.servers": destination,
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.size": 1024 * 1024,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    produce: Callable[..., None] = producer.produce
    copied = 0
    while copied < records:
        for msg in consumer.consume(10_000, 0.5):
            if msg.error():
                continue
            while True:
                try:
                    produce(
                        target,
                        msg.value(),
                        msg.key(),
                        msg.partition(),
                        timestamp=msg.timestamp()[1],
                        headers=msg.headers(),
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
            copied += 1
        producer.poll(0)
    producer.flush()
    consumer.close()


if __name__ == "__main__" and sys.argv[1:2] == ["naive"]:
    naive_copy(SOURCE, DESTINATION, sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
