"""How closely a connector's throttle holds its rate, and what it costs the task, on two Apache Kafka clusters.

    python benchmarks/throttle_accuracy.py [--seconds 30] [--records-rate 20000] [--bytes-rate 5000000]

Starts its own ZooKeeper and two Apache Kafka brokers on free ports (`mirus.faults.brokers.KafkaKit`, the
distribution `MIRUS_KAFKA_HOME` names or the kit's) and the embedded Postgres. One `mirus task run` process copies
each case: a backlog throttled by records (100-byte values), one throttled by bytes (1,000-byte values), no
throttle with records written at the records limit while it copies (the throttle's own cost is the difference
from the first case), and a backlog with no throttle (CPU per record flat out). Every second the destination's
high watermarks (exact on Apache Kafka) and the task process's CPU time (/proc) are sampled; after a 3 s warm-up
the rate of each 10 s window is compared with the limit.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import apache_kafka as kit
import common
import psutil
from confluent_kafka import Consumer, Producer

from replicator.state.store import Store

WARM_UP_S = 3.0
WINDOW_S = 10.0
PARTITIONS = 4


stop_writing = threading.Event()


def write_paced(bootstrap: str, topic: str, case: Case, records: int) -> None:
    """`records` records at `case.live_per_s` a second, in 10 ms slices, until `stop_writing`."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    value, per_slice, started = b"x" * case.size, case.live_per_s // 100, time.monotonic()
    for n in range(0, records, per_slice):
        for i in range(n, n + per_slice):
            producer.produce(topic, value, partition=i % PARTITIONS)
        producer.poll(0)
        if stop_writing.wait(max(0.0, started + (n + per_slice) / case.live_per_s - time.monotonic())):
            break
    producer.flush(30)


@dataclass
class Case:
    name: str
    size: int  # value bytes of each record
    records_per_s: int = 0
    bytes_per_s: int = 0
    live_per_s: int = 0  # no backlog: records written at this rate while the task copies them

    @property
    def limit(self) -> float:
        """The limit in records a second (0: none)."""
        return self.records_per_s or self.bytes_per_s / self.size


def run_case(store: Store, source: str, destination: str, case: Case, seconds: float, env: dict[str, str]) -> None:
    topic = f"throttle-{case.name}-{os.getpid()}"
    backlog = int((case.limit or case.live_per_s or 50_000) * (seconds + WARM_UP_S + 10))
    common.create_topic(source, topic, PARTITIONS)
    common.create_topic(destination, topic, PARTITIONS)
    writer = None
    if case.live_per_s:
        writer = threading.Thread(target=write_paced, args=(source, topic, case, backlog), daemon=True)
        writer.start()
    else:
        kit.load(source, topic, backlog, PARTITIONS, case.size)
    throttle = {
        "replication.throttle.records.per.second": case.records_per_s,
        "replication.throttle.bytes.per.second": case.bytes_per_s,
    }
    kit.put_engine_connector(store, topic, topic, "", PARTITIONS, 1, source=source, destination=destination, **throttle)
    counter = Consumer({"bootstrap.servers": destination, "group.id": "bench-throttle"})
    process = common.start_process(common.task_argv(topic), env)
    task = psutil.Process(process.pid)
    samples: list[tuple[float, int, float]] = []  # (time, records at the destination, task CPU seconds)
    try:
        started = None
        deadline = time.monotonic() + 120
        while True:
            now, count = time.monotonic(), common.records_in(counter, topic, PARTITIONS)
            samples.append((now, count, common.cpu_s([task])))
            if started is None and count > 0:
                started = now
            if started is not None and (now - started >= seconds + WARM_UP_S or count >= backlog):
                break
            if now > deadline:
                raise RuntimeError(f"{case.name}: nothing copied in 120 s")
            time.sleep(1.0)  # the sampling period of a measurement, not a wait for a condition
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(60)
        counter.close()
        if writer is not None:
            stop_writing.set()
            writer.join(30)
            stop_writing.clear()
    measured = [s for s in samples if s[0] - started >= WARM_UP_S]
    first, last = measured[0], measured[-1]
    cpu = (last[2] - first[2]) / (last[0] - first[0])
    per_record_us = (last[2] - first[2]) / max(last[1] - first[1], 1) * 1e6
    unit, scale = ("bytes/s", case.size) if case.bytes_per_s else ("records/s", 1)
    live = f", live traffic at {case.live_per_s:,} records/s" if case.live_per_s else ""
    print(f"{case.name}: " + (f"limit {case.limit * scale:,.0f} {unit}" if case.limit else "no limit") + live)
    start = first
    for sample in measured[1:]:
        if sample[0] - start[0] >= WINDOW_S - 0.5:
            rate = (sample[1] - start[1]) / (sample[0] - start[0])
            expected = case.limit or case.live_per_s
            error = f" ({(rate / expected - 1) * 100:+.1f} %)" if expected else ""
            print(f"  {sample[0] - start[0]:.1f} s window: {rate * scale:,.0f} {unit}{error}")
            start = sample
    print(f"  task CPU: {cpu * 100:.1f} % of a core, {per_record_us:.1f} us a record")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--records-rate", type=int, default=20_000)
    parser.add_argument("--bytes-rate", type=int, default=5_000_000)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="mirus-throttle-") as work,
        kit.private_clusters(Path(work)) as (_, source, destination),
        common.platform_database() as store,
    ):
        env = {**os.environ, "MIRUS_DATABASE_URL": store.engine.url.render_as_string(hide_password=False)}
        for case in (
            Case("records", 100, records_per_s=args.records_rate),
            Case("bytes", 1000, bytes_per_s=args.bytes_rate),
            Case("unthrottled-live", 100, live_per_s=args.records_rate),
            Case("unthrottled", 100),
        ):
            run_case(store, source, destination, case, args.seconds, env)


if __name__ == "__main__":
    main()
