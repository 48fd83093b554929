"""What one offset commit of many changed partitions costs Postgres, with and without each partition's destination
offset beside its source offset (at least once, commits store both since `mirus_records_resent_total`; before,
only exactly-once did).

    python benchmarks/commit_cost.py [--topics 20] [--partitions 500] [--rounds 30]

One task's lease, then `--rounds` commits of every partition (each one moved), alternating the two kinds; prints
the median wall time of `Store.commit` and the mean CPU the Postgres server processes used for it (a mean: the
kernel counts CPU time in 10-ms ticks, finer only summed over many commits). Uses
`MIRUS_DATABASE_URL` when set (the CPU column then reads 0 unless the server runs on this machine), else a private
embedded Postgres on free ports.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from mirus.local.stack import LocalStack, free_port
from mirus_dagster.settings import PlatformSettings
from replicator.state.database import make_engine, upgrade
from replicator.state.store import Store

CONNECTOR = "commit-bench"


def postgres_cpu() -> float:
    total = 0.0
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] == "postgres":
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
    return total


def run(url: str, topics: int, partitions: int, rounds: int) -> None:
    engine = make_engine(url)
    upgrade(engine)
    store = Store(engine)
    store.put_connector(CONNECTOR, {"name": CONNECTOR, "topics.whitelist": "t.*"}, 1)
    lease = store.claim_task(CONNECTOR, 0, "bench")
    names = [f"t{i:03d}" for i in range(topics)]
    results: dict[str, tuple[list[float], list[float]]] = {
        "source offsets only": ([], []),
        "with destination": ([], []),
    }
    position = 1_000_000
    for r in range(rounds * 2):
        kind = list(results)[r % 2]
        position += 1_000
        offsets = {(t, p): position + p for t in names for p in range(partitions)}
        destinations = {tp: offset * 3 for tp, offset in offsets.items()} if kind == "with destination" else None
        cpu, wall = postgres_cpu(), time.perf_counter()
        store.commit(lease, offsets, destinations)
        wall, cpu = time.perf_counter() - wall, postgres_cpu() - cpu
        if r >= 2:  # the first of each kind warms caches and the statement
            results[kind][0].append(wall)
            results[kind][1].append(cpu)
    print(f"{topics * partitions:,} changed partitions ({topics} topics x {partitions}), {rounds - 1} commits each")
    print(f"{'commit':<22} {'wall ms':>9} {'Postgres CPU ms':>16}")
    for kind, (walls, cpus) in results.items():
        print(f"{kind:<22} {statistics.median(walls) * 1000:>9.1f} {statistics.mean(cpus) * 1000:>16.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=20)
    parser.add_argument("--partitions", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    if url := os.environ.get("MIRUS_DATABASE_URL"):
        run(url, args.topics, args.partitions, args.rounds)
        return
    with tempfile.TemporaryDirectory(prefix="mirus-commit-") as state:
        settings = PlatformSettings(
            state_dir=Path(state),
            postgres_port=free_port(),
            source_bootstrap_servers="unused:1",
            destination_bootstrap_servers="unused:2",
        )
        local = LocalStack(settings)
        endpoints = local.up()
        try:
            run(endpoints.database_url, args.topics, args.partitions, args.rounds)
        finally:
            local.down()


if __name__ == "__main__":
    main()
