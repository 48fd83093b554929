"""Engine throughput against a naive consume→produce loop: same brokers, same records, same run.

    python benchmarks/engine_throughput.py [--records 2000000] [--partitions 4] [--size 100]

Starts a private embedded stack (or uses MIRUS_SOURCE_BOOTSTRAP_SERVERS / MIRUS_DESTINATION_BOOTSTRAP_SERVERS /
MIRUS_DATABASE_URL), loads the source topic once, then copies it twice: with the naive loop below and with a
`ReplicationTask` that also commits offsets to Postgres, records metrics and adds provenance headers.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import apache_kafka as kit
import common

from replicator.engine.task import ReplicationTask
from replicator.state.database import make_engine, upgrade
from replicator.state.store import Store


def engine_copy(
    store: Store,
    source: str,
    destination: str,
    topic: str,
    target: str,
    records: int,
    partitions: int,
    provenance: bool,
) -> None:
    name, suffix = f"bench-{target}", target.removeprefix(topic)
    headers = {"provenance.headers.enabled": provenance}
    kit.put_engine_connector(
        store, name, topic, suffix, partitions, 1, source=source, destination=destination, **headers
    )
    task = ReplicationTask(store, name, 0, "benchmark")

    def done() -> bool:
        return sum(s.committed or 0 for s in task.book.states.values()) >= records

    task.run(done)


def measure(label: str, fn: Callable[[], object], records: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), common.own_cpu_s()
    fn()
    wall, cpu = time.perf_counter() - wall, common.own_cpu_s() - cpu
    print(
        f"{label:<30} {records / wall:>10,.0f} records/s  {wall:7.2f} s wall  "
        f"{cpu / (records / 1e6):6.2f} CPU-s per million records"
    )
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--size", type=int, default=100)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as state:
        ports = {"source_port": 29092, "destination_port": 29093, "postgres_port": 25432}
        stack = common.embedded_stack(Path(state), ports)
        endpoints = stack.up()
        try:
            engine = make_engine(endpoints.database_url)
            upgrade(engine)
            src, dst = endpoints.source_bootstrap_servers, endpoints.destination_bootstrap_servers
            topic = f"bench-{int(time.time())}"
            common.create_topic(src, topic, args.partitions)
            for target in (f"{topic}.naive", f"{topic}.engine", f"{topic}.engine-plain"):
                common.create_topic(dst, target, args.partitions)
            print(f"loading {args.records:,} records of {args.size} bytes over {args.partitions} partitions ...")
            kit.load(src, topic, args.records, args.partitions, args.size)

            n = args.records
            naive, naive_cpu = measure(
                "naive", lambda: kit.naive_copy(src, dst, topic, f"{topic}.naive", n, args.partitions), n
            )
            store = Store(engine)
            for label, target, headers in (
                ("engine", f"{topic}.engine", True),
                ("engine, no provenance headers", f"{topic}.engine-plain", False),
            ):
                eng, eng_cpu = measure(
                    label, partial(engine_copy, store, src, dst, topic, target, n, args.partitions, headers), n
                )
                print(f"  {label}: throughput ratio to naive {naive / eng:.2f}, CPU ratio {eng_cpu / naive_cpu:.2f}")
        finally:
            stack.down()


if __name__ == "__main__":
    main()
