"""What holding partitions costs: one task with 10,000 partitions on Apache Kafka, beside the same task on 4.

    python benchmarks/estate.py [--topics 20] [--partitions 500] [--rounds 2] [--baseline OTHER_CHECKOUT]
        [--rate 10000] [--latency-rate 5000] [--mirrormaker]

Needs the two Apache Kafka 1.0 clusters running (see `benchmarks/apache_kafka.py`). Creates `--topics` topics of
`--partitions` partitions on both clusters (one record in each source partition, so every partition is read and
committed) and one 4-partition topic. Per round and per code (this checkout, then `--baseline`, alternating; each
on a Postgres database of its own, migrated by its own code), one connector with `tasks.max` 1 holds every wide
partition, run as `mirus task run`:
- start: seconds from the process start until every partition is copied and committed up to its end (records
  left by earlier runs included: the line says how many); resident memory;
- idle (10 s after that, over 20 s, partitions in the quiet tier; and again once every partition is in the dormant
  tier, 75 s after): the task's CPU and memory, the source broker's CPU, and what the task costs Postgres
  (transactions and rows written per second in its database, all Postgres processes' CPU);
- flowing: `--rate` records/s of 100 bytes spread evenly over every partition (one load process): the same figures,
  and the rate the load process achieved (it falls short of `--rate` over thousands of partitions);
- latency: `--latency-rate` records/s spread the same way, from the source broker's append to arrival at a
  destination reader (p50, p99): the source topics keep LogAppendTime, which the task copies, so the load
  generator's own queueing is not counted (one librdkafka producer sends a produce request per partition, and
  spreading thousands of records a second over thousands of partitions leaves it seconds behind by itself);
- takeover: a second `mirus task run` stands by; the owner is killed (SIGKILL) and one record produced: seconds
  until it is at the destination;
- then the same connector on the 4-partition topic, at the same rates (CPU and latency);
- commit: one `Store.commit` of every partition changed, in a process of that code: wall time and Postgres CPU.
`--mirrormaker` also measures the source broker idle beside Apache MirrorMaker 1.0 holding the same partitions
(and with no copier at all). The broker's CPU is its JVM's (`server-a.properties`), read from /proc.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from statistics import median

import apache_kafka as kit
import common
import psutil
from apache_kafka import DESTINATION, SOURCE
from confluent_kafka import OFFSET_END, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource
from sqlalchemy import Engine, create_engine, text

from replicator.clusters import log_offsets
from replicator.engine.source_reader import DORMANT_AFTER_S, QUIET_AFTER_S
from replicator.state.store import Store

NARROW = 4
WARMUP_S = 8.0  # flowing: measured after this long, once the task has caught up with the load
WINDOW_S = 20.0

# Run by `python -c` with the measured code first on the path: one commit of every partition, timed.
COMMIT_COST = """
import statistics, sys, time, psutil
from sqlalchemy import text
from replicator.state.database import make_engine
from replicator.state.store import Store
url, connector, topics, partitions = sys.argv[1], sys.argv[2], sys.argv[3].split(","), int(sys.argv[4])
store = Store(make_engine(url))
store.put_connector(connector, {"name": connector}, 1)
lease = store.claim_task(connector, 0, "commit-cost")
with store.engine.connect() as conn:
    backends = [psutil.Process(r[0]) for r in conn.execute(text(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"))]
# Postgres's CPU over all the commits, divided: a backend's CPU time moves in 10-ms ticks.
walls, runs = [], 30
store.commit(lease, {(t, p): p for t in topics for p in range(partitions)})
before = sum(sum(b.cpu_times()[:2]) for b in backends)
for i in range(1, runs + 1):
    offsets = {(t, p): 1000 * i + p for t in topics for p in range(partitions)}
    started = time.perf_counter()
    store.commit(lease, offsets)
    walls.append(time.perf_counter() - started)
cpu = (sum(sum(b.cpu_times()[:2]) for b in backends) - before) / runs
print(f"{statistics.median(walls) * 1000:.0f} {cpu * 1000:.1f}")
"""


@dataclass
class Window:
    """What a window of time cost: CPU shares are of one core."""

    task_cpu: float
    task_mib: float
    broker_cpu: float
    postgres_cpu: float
    transactions_s: float
    rows_s: float

    def __str__(self) -> str:
        return (
            f"task {self.task_cpu:5.1%} CPU {self.task_mib:4.0f} MiB | source broker {self.broker_cpu:5.1%} | "
            f"Postgres {self.postgres_cpu:5.1%} CPU, {self.transactions_s:5.1f} transactions/s, "
            f"{self.rows_s:7,.0f} rows/s"
        )


def measure(task: psutil.Process | None, engine: Engine, seconds: float = WINDOW_S) -> Window:
    broker, postgres = kit.broker_process(), common.postgres_processes()
    tasks = [task] if task else []
    before = (common.cpu_s(tasks), common.cpu_s([broker]), common.cpu_s(postgres), *common.database_writes(engine))
    time.sleep(seconds)
    time.sleep(0.6)  # statistics reach pg_stat_database up to 500 ms after the transaction
    after = (common.cpu_s(tasks), common.cpu_s([broker]), common.cpu_s(postgres), *common.database_writes(engine))
    delta = [(a - b) / seconds for a, b in zip(after, before, strict=True)]
    # The window's own two statistics reads are one transaction each.
    return Window(
        delta[0],
        common.rss_mib([task]) if task else 0.0,
        delta[1],
        delta[2],
        max(delta[3] - 2 / seconds, 0),
        delta[4],
    )


# Source records carry the broker's append time, which the task copies: latency is measured from there.
APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}


def create_estate_topics(topics: dict[str, int], append_time: bool = True) -> None:
    """`topics` on both clusters, one request each (Kafka 1.0 creates thousands of partitions slowly); the source's
    keep LogAppendTime unless `append_time` is false (the batch path hands such a topic's batches back)."""
    for bootstrap in (SOURCE, DESTINATION):
        config = APPEND_TIME if bootstrap == SOURCE and append_time else {}
        common.create_topics(bootstrap, topics, config, batch=1, timeout_s=600, poll_s=1.0)


def stamp_appends(names: list[str]) -> None:
    """Topics of an earlier run (`--prefix`) may predate LogAppendTime: set it (their only topic setting)."""
    admin = AdminClient({"bootstrap.servers": SOURCE})
    for future in admin.alter_configs([ConfigResource("topic", n, set_config=APPEND_TIME) for n in names]).values():
        future.result(60)


def load_spread(topics: str, partitions: int, rate: int, seconds: float) -> None:
    """Write `rate` records/s of 100 bytes for `seconds`, one partition after another over every partition; print
    the rate written (acknowledged records over the time until the last acknowledgement). A producer per topic, as
    the task's own (`replicator.engine.deliveries`): one librdkafka producer over 10,000 partitions wrote only
    116-8,009 records/s of 10,000."""
    names = topics.split(",")
    targets = [(t, p) for p in range(partitions) for t in names]
    settings = {"bootstrap.servers": SOURCE, "linger.ms": 5, "queue.buffering.max.messages": 1_000_000}
    producers = {t: Producer(settings) for t in names}
    acked, last = [0], [0.0]

    def count(err: KafkaError | None, _msg: object) -> None:
        if err is None:
            acked[0] += 1
            last[0] = time.perf_counter()

    value = b"v" * 100
    produce = {t: partial(producer.produce, on_delivery=count) for t, producer in producers.items()}
    sent, start, total = 0, time.perf_counter(), int(rate * seconds)
    # Until `seconds` are over: behind the rate (a broker taking a produce request per partition), it writes fewer.
    while sent < total and time.perf_counter() - start < seconds:
        due = min(int((time.perf_counter() - start) * rate), total)
        while sent < due:
            topic, partition = targets[sent % len(targets)]
            try:
                produce[topic](topic, value, None, partition)
            except BufferError:
                producers[topic].poll(0.001)
                continue
            sent += 1
        for producer in producers.values():
            producer.poll(0)
        time.sleep(0.001)
    deadline = time.perf_counter() + 20
    while any(len(p) for p in producers.values()) and time.perf_counter() < deadline:
        for producer in producers.values():
            producer.poll(0.01)
    print(f"{acked[0] / max(last[0] - start, seconds):.0f}", flush=True)


def start_load(topics: list[str], partitions: int, rate: int, seconds: float) -> subprocess.Popen[bytes]:
    argv = [sys.executable, __file__, "load", ",".join(topics), str(partitions), str(rate), str(seconds)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)


def written(loader: subprocess.Popen[bytes]) -> float:
    """The records/s a load process wrote, once it has ended."""
    out, _ = loader.communicate(timeout=60)
    return float(out.split()[-1]) if out.split() else 0.0


def latency(topics: list[str], partitions: int, rate: int, seconds: float = 15.0) -> tuple[float, float]:
    """p50 and p99 (ms) from CreateTime to arrival at a reader of the destination topics, first 3 s dropped."""
    reader = Consumer(
        {
            "bootstrap.servers": DESTINATION,
            "group.id": "estate-latency",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    # The ends asked in one ListOffsets request (a consumer assigned OFFSET_END asks partition by partition: behind a
    # task's produce requests, a destination broker took longer than the whole window to answer 10,000 of them).
    wanted = [(t, p) for t in topics for p in range(partitions)]
    ends = log_offsets(AdminClient({"bootstrap.servers": DESTINATION}), wanted, latest=True)
    reader.assign([TopicPartition(t, p, ends.get((t, p), OFFSET_END)) for t, p in wanted])
    reader.consume(1, 3.0)
    # Only this load's records count: copies of an earlier phase's may still be arriving (a backlog).
    started = time.time_ns() // 1_000_000
    loader = start_load(topics, partitions, rate, seconds)
    seen: list[tuple[int, list[int]]] = []
    deadline = time.monotonic() + seconds + 20
    count, expected = 0, int(rate * seconds)
    while count < expected and time.monotonic() < deadline:
        msgs = reader.consume(10_000, 0) or reader.consume(1, 0.1)
        now = time.time_ns() // 1_000_000
        created = [m.timestamp()[1] for m in msgs if m.error() is None and m.timestamp()[1] >= started]
        seen.append((now, created))
        count += len(created)
    written(loader)
    reader.close()
    pairs = [(c, now) for now, created in seen for c in created]
    if not pairs:
        raise RuntimeError("no record reached the destination")
    kept = sorted(now - c for c, now in pairs if c >= started + 3000)
    if not kept:
        raise RuntimeError("no record created after the load's first 3 s reached the destination in time")
    return kept[len(kept) // 2], kept[min(int(0.99 * len(kept)), len(kept) - 1)]


def task_log(connector: str, role: str) -> Path:
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"estate-{connector}-{role}-{os.getpid()}.log"


@contextmanager
def task_process(code: str | None, url: str, connector: str, role: str = "owner") -> Iterator[psutil.Process]:
    """`mirus task run` of the code under test (this checkout's own when `code` is None), its log in a file."""
    env = {**os.environ, "MIRUS_DATABASE_URL": url, "PYTHONPATH": code or str(common.ROOT)}
    log = task_log(connector, role)
    log.write_text("")  # a standby is known to stand by by its log: not by an earlier round's
    # Run from the code's own directory: `python -c` puts the working directory ahead of PYTHONPATH.
    proc = common.start_process(common.task_argv(connector), env, log=log, cwd=code or common.ROOT)
    try:
        yield psutil.Process(proc.pid)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(120)
        if proc.returncode not in (0, -signal.SIGINT, -signal.SIGKILL):
            last = [line for line in log.read_text().splitlines() if line.strip()][-3:]
            print(f"    (the task exited with {proc.returncode}: {' | '.join(last)[:600]})", flush=True)


def takeover(code: str | None, url: str, topic: str, partition: int, owner: psutil.Process) -> float:
    """Seconds from a kill -9 of the owner until a record produced right after it is at the destination, with a
    warm standby (a second `mirus task run`) standing by."""
    reader = Consumer(
        {
            "bootstrap.servers": DESTINATION,
            "group.id": "estate-takeover",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    reader.assign([TopicPartition(topic, partition, OFFSET_END)])
    reader.consume(1, 3.0)  # the END offset is resolved before the record is produced
    with task_process(code, url, "wide", role="standby"):
        log = task_log("wide", "standby")
        deadline = time.monotonic() + 120
        while "standing by" not in log.read_text():
            if time.monotonic() > deadline:
                raise RuntimeError("the standby never stood by")
            time.sleep(0.1)
        owner.kill()
        killed = time.monotonic()
        producer = Producer({"bootstrap.servers": SOURCE, "linger.ms": 0})
        producer.produce(topic, b"after the kill", None, partition)
        producer.flush(30)
        while not [m for m in reader.consume(10, 0.05) if m.error() is None]:
            if time.monotonic() - killed > 120:
                raise RuntimeError("nothing replicated within 120 s of the kill")
        took = time.monotonic() - killed
    reader.close()
    return took


def on_lanes(log: Path, partitions: int, timeout_s: float = 180.0) -> None:
    """Wait until the task's log says `partitions` partitions moved to the batch path: a restarted task starts every
    partition on the record path, and a load started sooner measures the record path and the move."""
    deadline = time.monotonic() + timeout_s
    while (
        sum(int(n) for n in re.findall(r"copy\.mode=batches: (\d+) partition\(s\) copied as batches", log.read_text()))
        < partitions
    ):
        if time.monotonic() > deadline:
            raise RuntimeError(f"not every partition on the batch path after {timeout_s:.0f} s")
        time.sleep(0.5)


def stored_offsets(engine: Engine, connector: str) -> tuple[int, int]:
    """Partitions with a stored offset, and the sum of those offsets, whichever layout the code under test uses."""
    with engine.connect() as conn:
        per_topic = conn.execute(
            text(
                "SELECT count(*) FROM information_schema.columns"
                " WHERE table_name = 'offsets' AND column_name = 'positions'"
            )
        ).scalar()
        query = (
            "SELECT count(x), coalesce(sum(x), 0) FROM offsets, unnest(positions) AS x WHERE connector = :c"
            if per_topic
            else 'SELECT count(*), coalesce(sum("offset"), 0) FROM offsets WHERE connector = :c'
        )
        count, total = conn.execute(text(query), {"c": connector}).one()
        return int(count), int(total)


def caught_up(engine: Engine, connector: str, partitions: int, end: int) -> bool:
    count, total = stored_offsets(engine, connector)
    return count >= partitions and total >= end


def one_round(
    admin: Engine, code: str | None, label: str, wide: list[str], narrow: str, args: argparse.Namespace, tag: str
) -> dict[str, float]:
    # A database of its own, migrated by the code under test.
    with common.fresh_database(admin, f"estate_{tag}", code) as url:
        engine = create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1))
        try:
            return measure_code(engine, url, code, label, wide, narrow, args)
        finally:
            engine.dispose()


def measure_code(
    engine: Engine, url: str, code: str | None, label: str, wide: list[str], narrow: str, args: argparse.Namespace
) -> dict[str, float]:
    partitions, total = args.partitions, len(wide) * args.partitions
    store = Store(engine)
    figures: dict[str, float] = {}
    mode = {"copy.mode": args.copy_mode}
    kit.put_engine_connector(store, "wide", ",".join(wide), "", partitions, 1, **mode)
    end = sum(common.end_offsets(SOURCE, wide, partitions).values())
    with task_process(code, url, "wide") as task:
        started = time.monotonic()
        while not caught_up(engine, "wide", total, end):
            if not task.is_running() or task.status() == psutil.STATUS_ZOMBIE:
                raise RuntimeError(
                    f"{label}: the task exited; {stored_offsets(engine, 'wide')[0]:,} of {total:,} partitions committed"
                )
            if time.monotonic() - started > 600:
                raise TimeoutError(f"{label}: not everything copied and committed after 600 s")
            time.sleep(0.2)
        figures["start_s"] = time.monotonic() - started
        print(
            f"  {label:<9} {total:,} partitions, {end:,} records: all copied and committed after "
            f"{figures['start_s']:.1f} s, "
            f"{common.rss_mib([task]):.0f} MiB",
            flush=True,
        )
        time.sleep(10)
        quiet = measure(task, engine)
        print(f"  {label:<9} idle, quiet:        {quiet}", flush=True)
        time.sleep(max(QUIET_AFTER_S + DORMANT_AFTER_S + 10 - 10 - WINDOW_S, 0))
        idle = measure(task, engine)
        print(f"  {label:<9} idle, dormant:      {idle}", flush=True)
        # Idle, so that the standby has nothing to catch up with first.
        figures["takeover_s"] = takeover(code, url, wide[-1], partitions - 1, task)
        print(
            f"  {label:<9} kill -9 of the owner -> a record replicated by the standby: {figures['takeover_s']:.1f} s",
            flush=True,
        )
    with task_process(code, url, "wide") as task:
        while not caught_up(engine, "wide", total, end):
            time.sleep(0.2)
        if args.copy_mode == "batches":
            on_lanes(task_log("wide", "owner"), total)
        loader = start_load(wide, partitions, args.rate, WARMUP_S + WINDOW_S + 2)
        time.sleep(WARMUP_S)
        flowing = measure(task, engine)
        print(
            f"  {label:<9} {args.rate:,}/s over {total:,}: {flowing} (load written at {written(loader):,.0f}/s)",
            flush=True,
        )
        p50, p99 = latency(wide, partitions, args.latency_rate)
        print(
            f"  {label:<9} latency at {args.latency_rate:,}/s over {total:,}: p50 {p50:.0f} ms, p99 {p99:.0f} ms",
            flush=True,
        )
    figures.update(
        quiet_cpu=quiet.task_cpu,
        quiet_broker=quiet.broker_cpu,
        idle_cpu=idle.task_cpu,
        idle_mib=idle.task_mib,
        idle_broker=idle.broker_cpu,
        idle_tx=idle.transactions_s,
        idle_rows=idle.rows_s,
        flow_cpu=flowing.task_cpu,
        flow_tx=flowing.transactions_s,
        flow_rows=flowing.rows_s,
        flow_pg=flowing.postgres_cpu,
        p99=p99,
    )
    kit.put_engine_connector(store, "narrow", narrow, "", NARROW, 1, **mode)
    end = sum(common.end_offsets(SOURCE, [narrow], NARROW).values())
    with task_process(code, url, "narrow") as task:
        while not caught_up(engine, "narrow", NARROW, end):
            time.sleep(0.2)
        loader = start_load([narrow], NARROW, args.rate, WARMUP_S + WINDOW_S + 2)
        time.sleep(WARMUP_S)
        few = measure(task, engine)
        print(
            f"  {label:<9} {args.rate:,}/s over {NARROW}: {few} (load written at {written(loader):,.0f}/s)", flush=True
        )
        p50_few, p99_few = latency([narrow], NARROW, args.latency_rate)
        print(
            f"  {label:<9} latency at {args.latency_rate:,}/s over {NARROW}: p50 {p50_few:.0f} ms, "
            f"p99 {p99_few:.0f} ms",
            flush=True,
        )
    figures.update(few_cpu=few.task_cpu, p99_few=p99_few)
    env = {**os.environ, **({"PYTHONPATH": code} if code else {})}
    out = subprocess.run(
        [sys.executable, "-c", COMMIT_COST, url, "commit-cost", ",".join(wide), str(partitions)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=code or common.ROOT,
    ).stdout
    wall_ms, pg_ms = (float(x) for x in out.split())
    figures.update(commit_ms=wall_ms, commit_pg_ms=pg_ms)
    print(f"  {label:<9} one commit of {total:,} partitions: {wall_ms:.0f} ms, Postgres CPU {pg_ms:.1f} ms", flush=True)
    return figures


def idle_beside_mirrormaker(wide: list[str], partitions: int, admin: Engine) -> None:
    nobody = measure(None, admin)
    print(f"  no copier: source broker {nobody.broker_cpu:.1%}", flush=True)
    env = dict(os.environ)
    proc = common.start_process(kit.mirrormaker_argv("|".join(wide))[0], env)
    try:
        mm = psutil.Process(proc.pid)
        started, busy = time.monotonic(), 1.0
        while busy > 0.1 and time.monotonic() - started < 300:  # joined its group, copied everything, idle since
            before = common.cpu_s([mm])
            time.sleep(5)
            busy = (common.cpu_s([mm]) - before) / 5
        print(f"  (MirrorMaker idle after {time.monotonic() - started:.0f} s)", flush=True)
        window = measure(psutil.Process(proc.pid), admin)
        print(
            f"  MirrorMaker 1.0 idle on the same {len(wide) * partitions:,} partitions: source broker "
            f"{window.broker_cpu:.1%}; MirrorMaker {window.task_cpu:.1%} CPU, {window.task_mib:.0f} MiB",
            flush=True,
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "load":
        load_spread(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=20)
    parser.add_argument("--partitions", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--latency-rate", type=int, default=5_000)
    parser.add_argument("--baseline", help="another checkout of the project, measured alternately with this one")
    parser.add_argument("--mirrormaker", action="store_true", help="also the source broker beside MirrorMaker 1.0")
    parser.add_argument("--prefix", help="reuse the topics of an earlier run")
    parser.add_argument(
        "--copy-mode",
        choices=("records", "batches"),
        default="records",
        help="the connector's copy.mode; batches: source topics keep CreateTime (latency then includes the load's "
        "own queueing)",
    )
    args = kit.parse_args(parser)
    prefix = args.prefix or f"estate{int(time.time())}"
    wide = [f"{prefix}-{i:03d}" for i in range(args.topics)]
    narrow = f"{prefix}-narrow"
    print(
        f"creating {args.topics} topics x {args.partitions} partitions and one of {NARROW} on both clusters ...",
        flush=True,
    )
    started = time.perf_counter()
    if not args.prefix:
        create_estate_topics({**dict.fromkeys(wide, args.partitions), narrow: NARROW}, args.copy_mode == "records")
    elif args.copy_mode == "records":
        stamp_appends([*wide, narrow])
    kit.fill(wide, args.partitions)
    kit.fill([narrow], NARROW)
    print(f"  ready in {time.perf_counter() - started:.0f} s", flush=True)
    codes: list[tuple[str, str | None]] = [("this", None)] + ([("baseline", args.baseline)] if args.baseline else [])
    results: dict[str, list[dict[str, float]]] = {label: [] for label, _ in codes}
    with common.platform_database() as store:
        admin = store.engine.execution_options(isolation_level="AUTOCOMMIT")
        if args.mirrormaker:
            idle_beside_mirrormaker(wide, args.partitions, admin)
        for round_ in range(args.rounds):
            print(f"round {round_ + 1} (load average {common.load_average():.1f})", flush=True)
            for label, code in codes if round_ % 2 == 0 else codes[::-1]:
                try:
                    results[label].append(one_round(admin, code, label, wide, narrow, args, f"{label}_{round_}"))
                except RuntimeError as exc:
                    print(f"  {label:<9} failed: {exc}", flush=True)
    print("medians:")
    for label, runs in results.items():
        if not runs:
            print(f"  {label:<9} no completed round")
            continue
        m = {key: median(r[key] for r in runs) for key in runs[0]}
        print(
            f"  {label:<9} all committed {m['start_s']:.1f} s | idle {m['idle_cpu']:.1%} CPU "
            f"{m['idle_mib']:.0f} MiB, broker {m['idle_broker']:.1%} (quiet: {m['quiet_cpu']:.1%}, broker "
            f"{m['quiet_broker']:.1%}), {m['idle_tx']:.1f} tx/s "
            f"{m['idle_rows']:.0f} rows/s | "
            f"{args.rate:,}/s: {m['flow_cpu']:.1%} CPU ({m['flow_cpu'] / max(m['few_cpu'], 1e-9):.2f} x {NARROW} "
            f"partitions), {m['flow_tx']:.1f} tx/s {m['flow_rows']:,.0f} rows/s, Postgres {m['flow_pg']:.1%} | "
            f"p99 at {args.latency_rate:,}/s {m['p99']:.0f} ms ({m['p99_few']:.0f} on {NARROW}) | "
            f"commit {m['commit_ms']:.0f} ms, Postgres {m['commit_pg_ms']:.1f} ms | "
            f"kill -9 -> replicating {m['takeover_s']:.1f} s"
        )


if __name__ == "__main__":
    main()
