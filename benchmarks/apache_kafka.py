"""Apache Kafka for the benchmarks that run on it: the kit's two clusters (or others the environment names), and
the copiers compared on them.

The kit is a directory (`$MIRUS_KAFKA_KIT`, default `/work/shared/apache-kafka`) with `start.sh`, `preload.sh` and
`mirrormaker.sh`: cluster a on 127.0.0.1:39092 is the source, cluster b on 127.0.0.1:49092 the destination. A script
that starts clusters of its own (`private_clusters`, or `wan.py` behind its delaying proxy) passes their addresses.
Postgres is `common.platform_database`'s.

Every copier runs as its own process, so its CPU time is its own (`os.wait4`), start-up included:
- `mirrormaker`: Apache MirrorMaker 1.0 (the kit's `mirrormaker.sh TOPIC`, or its settings from a Kafka distribution),
  copying TOPIC to the same name;
- `naive`: the tuned consume→produce loop below (this file run with `naive ...`);
- `engine`: `mirus task run CONNECTOR TASK`, one process per task, default connector settings; `engine-*` the same
  with the connector properties of `ENGINE_COPIERS`.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import common
import psutil
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from mirus.faults.brokers import KafkaKit
from replicator.batches.copier import BatchCopier
from replicator.batches.wire import KafkaWire, Partition
from replicator.configuration.connector import validate_submission

# What `put_baseline_connector` runs from a checkout's own apache_kafka.py: this one's, once it is the baseline.
from replicator.state.database import make_engine, upgrade  # noqa: F401
from replicator.state.store import Store

# The kit's clusters, or others named as the suite names them (e.g. the second kit on 39192/49192).
KIT_SOURCE = "127.0.0.1:39092"
SOURCE = os.environ.get("MIRUS_SOURCE_BOOTSTRAP_SERVERS", KIT_SOURCE)
DESTINATION = os.environ.get("MIRUS_DESTINATION_BOOTSTRAP_SERVERS", "127.0.0.1:49092")
KIT = Path(os.environ.get("MIRUS_KAFKA_KIT", "/work/shared/apache-kafka"))
# The engine's copiers: connector properties beside the defaults, as an operator would set them.
ENGINE_COPIERS: dict[str, dict[str, str]] = {
    "engine": {},
    "engine-plain": {"provenance.headers.enabled": "false"},
    "engine-compact": {"provenance.headers.compact": "true"},
    "engine-eos": {"exactly.once.support": "required"},
    "engine-batches": {"copy.mode": "batches"},
}


def broker_process(cluster: str = "a") -> psutil.Process:
    """The kit's broker of cluster `a` (the source) or `b` (the destination)."""
    for proc in psutil.process_iter(["cmdline"]):
        if any(arg.endswith(f"server-{cluster}.properties") for arg in proc.info["cmdline"] or ()):
            return proc
    raise RuntimeError(f"the kit's broker of cluster {cluster} (server-{cluster}.properties) was not found")


def wait_for_quiet_brokers(share: float = 0.1, timeout_s: float = 300.0) -> None:
    """Until each of the kit's brokers used less than `share` of a core over a second: a broker deletes or creates
    a thousand partitions for tens of seconds after the request (its controller's work), which the next run's
    figures would otherwise carry."""
    brokers = [broker_process(cluster) for cluster in "ab"]

    def quiet() -> bool:
        before = [common.cpu_s([b]) for b in brokers]
        time.sleep(1.0)
        return all(common.cpu_s([b]) - cpu < share for b, cpu in zip(brokers, before, strict=True))

    common.wait_until(quiet, timeout_s, 0.0, "the brokers quiet after creating or deleting partitions")


@dataclass
class Run:
    copier: str
    wall_s: float
    cpu_s: float
    load: float  # 1-minute load average when the run started
    # Records/s from the first records seen at the destination to the last: the rate once copying, without the
    # copier's start (a JVM's, or Python's imports), which a long-running replicator pays once.
    copy_rate: float


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


@contextmanager
def private_clusters(work: Path) -> Iterator[tuple[KafkaKit, str, str]]:
    """ZooKeeper and two single-broker Apache Kafka clusters of the suite's distribution (`MIRUS_KAFKA_HOME`) on free
    ports under `work`, not the kit's; yields the kit and the source's and the destination's bootstrap servers."""
    kafka = KafkaKit(work, common.free_port())
    try:
        kafka.start_zookeeper()
        source, destination = (
            kafka.broker(n, common.free_port(), None, common.free_port()) for n in ("source", "destination")
        )
        source.start()
        destination.start()
        yield kafka, source.bootstrap, destination.bootstrap
    finally:
        kafka.stop()


def preload(
    topic: str,
    records: int,
    partitions: int,
    size: int = 100,
    bootstrap: str = SOURCE,
    values: Sequence[bytes] = (),
    compression: str = "none",
    batch_bytes: int | None = None,
) -> None:
    """`records` records of `size` bytes (or cycling through `values`) in a new topic: on the kit's source written by
    Kafka's own ProducerPerformance (`preload.sh`, which knows only the kit's ports; 64 KB batches), elsewhere,
    compressed or with `batch_bytes` by `load`."""
    if bootstrap == KIT_SOURCE and size == 100 and not values and compression == "none" and batch_bytes is None:
        subprocess.run([str(KIT / "preload.sh"), str(records), topic, str(partitions)], check=True, capture_output=True)
        return
    common.create_topic(bootstrap, topic, partitions)
    load(bootstrap, topic, records, partitions, size, values, compression, batch_bytes or 1_000_000)


def event_values(size: int, count: int = 1000) -> list[bytes]:
    """`count` JSON-like events of `size` bytes, as compressible as a topic's events usually are."""
    values = []
    for i in range(count):
        event = b'{"id":%d,"user":"user-%04d","action":"%s","amount":%d.%02d,"note":"' % (
            i, i % 977, (b"view", b"click", b"buy", b"return")[i % 4], i % 500, i % 100
        )  # fmt: skip
        values.append((event + b"x" * max(size - len(event) - 2, 0) + b'"}')[:size])
    return values


def load(
    bootstrap: str,
    topic: str,
    records: int,
    partitions: int,
    size: int = 100,
    values: Sequence[bytes] = (),
    compression: str = "none",
    batch_bytes: int = 1_000_000,
) -> None:
    """`records` records of `size` bytes (or cycling through `values`) over `partitions`, as fast as they go, in
    batches of up to `batch_bytes`."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": batch_bytes,
            "queue.buffering.max.messages": 500_000,
            "compression.type": compression,
        }
    )
    pool, produce = values or [b"x" * size], producer.produce
    for i in range(records):
        while True:
            try:
                produce(topic, pool[i % len(pool)], partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(300):
        raise RuntimeError(f"records written to {topic} not acknowledged")


def fill(names: list[str], partitions: int, bootstrap: str = SOURCE) -> None:
    """One record in every partition of `names` that has none, so that every partition is read and committed (a busy
    Kafka 1.0 broker times some out: retried)."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-fill"})
    empty = [
        (n, p)
        for n in names
        for p in range(partitions)
        if reader.get_watermark_offsets(TopicPartition(n, p), timeout=30)[1] <= 0
    ]
    reader.close()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50})
    failed: list[tuple[str, int]] = []
    while empty:
        failed.clear()
        for name, p in empty:
            while True:
                try:
                    producer.produce(
                        name,
                        b"x",
                        None,
                        p,
                        on_delivery=lambda err, msg: err and failed.append((msg.topic(), msg.partition())),
                    )
                    break
                except BufferError:
                    producer.poll(0.1)
        producer.flush(600)
        empty = list(failed)


def put_engine_connector(
    store: Store,
    name: str,
    topic: str,
    suffix: str,
    partitions: int,
    tasks: int,
    *,
    source: str = SOURCE,
    destination: str = DESTINATION,
    **extra: object,
) -> None:
    """A connector with default settings but `extra` copying `topic` (several: comma-separated) to `topic + suffix`,
    each topic's partitions spread over the tasks."""
    config = validate_submission(
        {
            "name": name,
            "consumer.bootstrap.servers": source,
            "destination.consumer.bootstrap.servers": destination,
            "topics.whitelist": topic,
            "destination.topic.name.suffix": suffix,
            "tasks.max": tasks,
            **extra,
        }
    )
    store.put_connector(name, config.raw, tasks)
    topics = topic.split(",")
    store.write_assignment(
        name, {t: [(tp, p) for tp in topics for p in range(partitions) if p % tasks == t] for t in range(tasks)}
    )


@contextmanager
def baseline_database(name: str) -> Iterator[str]:
    """A database of its own for the engine of another checkout (`engine-baseline`): its schema may be older than
    this checkout's, so that checkout's own code migrates it and stores its connectors (`put_baseline_connector`).
    Yields its URL."""
    with common.platform_database(migrate=False, name=f"baseline-{name}") as store:
        yield store.engine.url.render_as_string(hide_password=False)


def put_baseline_connector(checkout: str, url: str, *args: object, **extra: object) -> None:
    """`put_engine_connector` run by `checkout`'s own benchmark helpers against its database at `url`."""
    program = (
        f"import sys; sys.path.insert(0, {str(Path(checkout) / 'benchmarks')!r}); import apache_kafka as kit; "
        f"engine = kit.make_engine({url!r}); kit.upgrade(engine); "
        f"kit.put_engine_connector(kit.Store(engine), *{args!r}, **{extra!r})"
    )
    subprocess.run(["env", f"PYTHONPATH={checkout}", sys.executable, "-P", "-c", program], check=True)


def baseline_argvs(checkout: str, argvs: list[list[str]], url: str) -> list[list[str]]:
    """`argvs` run on `checkout`'s engine and database (-P: `python -c` would put the working directory, this
    checkout, ahead of PYTHONPATH)."""
    return [["env", f"PYTHONPATH={checkout}", f"MIRUS_DATABASE_URL={url}", a[0], "-P", *a[1:]] for a in argvs]


def engine_argv(name: str, tasks: int) -> list[list[str]]:
    return [common.task_argv(name, t) for t in range(tasks)]


def mirrormaker_argv(
    topic: str, source: str | None = None, destination: str | None = None, home: Path | None = None, work: Path = KIT
) -> list[list[str]]:
    """Apache MirrorMaker 1.0 copying `topic` to the same name: the kit's `mirrormaker.sh`, or, between `source` and
    `destination`, the same settings and JVM options from the Kafka distribution at `home` (its files in `work`)."""
    if source is None or destination is None or home is None:
        return [[str(KIT / "mirrormaker.sh"), topic]]
    consumer, producer = work / f"mm-consumer-{topic}.properties", work / f"mm-producer-{topic}.properties"
    consumer.write_text(
        f"bootstrap.servers={source}\ngroup.id=mm-{random.randrange(10**9)}\nauto.offset.reset=earliest\n"
    )
    producer.write_text(f"bootstrap.servers={destination}\nacks=1\nlinger.ms=5\nbatch.size=65536\n")
    return [
        [
            "java",
            "-Xmx1g",
            f"-Dlog4j.configuration=file:{home / 'config' / 'tools-log4j.properties'}",
            "-cp",
            f"{home / 'libs'}/*",
            "kafka.tools.MirrorMaker",
            "--consumer.config",
            str(consumer),
            "--producer.config",
            str(producer),
            "--num.streams",
            "2",
            "--whitelist",
            topic,
        ]
    ]


def naive_argv(topic: str, target: str, records: int, partitions: int, kind: str = "naive") -> list[list[str]]:
    """`naive` (tuned as a user would), `bare` (the engine's client settings) or `batches` (the batch copier of
    `replicator.batches`, alone) copying `topic` to `target`."""
    return [[sys.executable, __file__, kind, topic, target, str(records), str(partitions)]]


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
    log: Path | None = None,
    host: subprocess.Popen[bytes] | None = None,
    begin: Callable[[], None] | None = None,
) -> Run:
    """Start the copier's processes, then call `begin`; wall = start until `target` holds `records` at the destination
    (or `copied()` reaches it: a transactional copy's commit markers count in high watermarks); CPU-s of all its
    processes. `host`: a process already running that `begin` hands the copy to (a worker, told by a connector
    written to Postgres), stopped with the others: its CPU from the start on."""
    counter = Consumer({"bootstrap.servers": DESTINATION, "group.id": "bench-counter"}) if copied is None else None
    load = common.load_average()

    def count() -> int:
        if copied is not None:
            return copied()
        assert counter is not None
        return common.records_in(counter, target, partitions)

    first: list[tuple[float, int]] = []  # when records were first seen at the destination, and how many

    def copied_all() -> bool:
        n = count()
        if n and not first:
            first.append((time.perf_counter(), n))
        if n >= records:
            return True
        if any(p.poll() is not None and p.returncode != 0 for p in procs):
            raise RuntimeError(
                f"{copier} exited with {[p.returncode for p in procs]}" + (f" (see {log})" if log else "")
            )
        return False

    start = time.perf_counter()
    before = sum(psutil.Process(host.pid).cpu_times()[:2]) if host else 0.0
    procs = [common.start_process(argv, env, log=log) for argv in argvs] + ([host] if host else [])
    try:
        if begin is not None:
            begin()
        common.wait_until(copied_all, timeout_s, 0.02, f"{copier}: all {records} records at {target}")
        end = time.perf_counter()
        wall = end - start
        (seen_at, seen), *_ = first
        # (Undefined when every record was there at the first look.)
        copy_rate = (records - seen) / (end - seen_at) if seen < records else float("nan")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(stop_signal)
        if counter is not None:
            counter.close()
    return Run(copier, wall, sum(reap(p) for p in procs) - before, load, copy_rate)


def reap(proc: subprocess.Popen[bytes], grace_s: float = 60.0) -> float:
    """The CPU seconds of a process told to stop, once it has ended; killed after `grace_s` (a copier stuck on its
    destination must not stall the benchmark)."""
    deadline = time.monotonic() + grace_s
    while True:
        pid, _status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = 0  # reaped here; keep Popen from waiting again
            return usage.ru_utime + usage.ru_stime
        if time.monotonic() > deadline:
            proc.kill()
            deadline = float("inf")
        time.sleep(0.05)


def naive_copy(
    source: str, destination: str, topic: str, target: str, records: int, partitions: int, bare: bool = False
) -> None:
    """A hand-written copier: consume → produce with key, value, partition, timestamp and headers, nothing else (no
    offsets, metrics or provenance; flush at the end). `naive` is tuned as a user would tune it; `bare` uses the
    engine's own client settings (a default connector's), so that the engine's CPU beyond it is its bookkeeping."""
    if bare:
        config = validate_submission(
            {
                "name": "bench-bare",
                "consumer.bootstrap.servers": source,
                "destination.consumer.bootstrap.servers": destination,
                "topics.whitelist": topic,
            }
        )
        consumer_settings, producer_settings = config.consumer_settings(), config.producer_settings(0)
    else:
        consumer_settings = {
            "bootstrap.servers": source,
            "group.id": "bench-naive",
            "enable.auto.commit": False,
            "fetch.max.bytes": 50 * 1024 * 1024,
            "queued.min.messages": 200_000,
        }
        producer_settings = {
            "bootstrap.servers": destination,
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.size": 1024 * 1024,
            "queue.buffering.max.messages": 1_000_000,
        }
    consumer = Consumer(consumer_settings)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    producer = Producer(producer_settings)
    produce: Callable[..., None] = producer.produce
    copied = 0
    while copied < records:
        for msg in consumer.consume(10_000, 0.5):
            if msg.error():
                continue
            while True:
                try:  # positional, as the engine: topic, value, key, partition, callback, on_delivery, ts, headers
                    ts, headers = msg.timestamp()[1], msg.headers()
                    produce(target, msg.value(), msg.key(), msg.partition(), None, None, ts, headers)
                    break
                except BufferError:
                    producer.poll(0.05)
            copied += 1
        producer.poll(0)
    producer.flush()
    consumer.close()


def batch_copy(source: str, destination: str, topic: str, target: str, records: int, partitions: int) -> None:
    """The batch path's copier alone (`replicator.batches.copier`; no engine around it: no offsets, metrics or
    cycle guard): every partition's batches fetched and produced as bytes until `records` are copied."""
    with (
        KafkaWire({"bootstrap.servers": source}, fetch_max_bytes=16 * 1024 * 1024) as fetcher,
        KafkaWire({"bootstrap.servers": destination}, fetch_max_bytes=1024 * 1024) as producer,
    ):
        copier = BatchCopier(fetcher, producer, partition_fetch_bytes=4 * 1024 * 1024)
        for p in range(partitions):
            copier.start(Partition(topic, p), 0, target, 1_000_012)
        copied = 0
        while copied < records:
            step = copier.step()
            if step.problems or step.handed_back:
                raise RuntimeError(f"batch copy stopped: {step.problems or step.handed_back}")
            copied += step.records
        copier.close()


if __name__ == "__main__" and sys.argv[1:2] == ["batches"]:
    batch_copy(SOURCE, DESTINATION, *sys.argv[2:4], int(sys.argv[4]), int(sys.argv[5]))

if __name__ == "__main__" and sys.argv[1:2] in (["naive"], ["bare"]):
    naive_copy(SOURCE, DESTINATION, *sys.argv[2:4], int(sys.argv[4]), int(sys.argv[5]), bare=sys.argv[1] == "bare")
