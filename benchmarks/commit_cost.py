"""What one offset commit of many changed partitions costs Postgres, with and without each partition's destination
offset beside its source offset (at least once, commits store both since `mirus_records_resent_total`; before,
only exactly-once did).

    python benchmarks/commit_cost.py [--topics 20] [--partitions 500] [--rounds 30]

One task's lease, then `--rounds` commits of every partition (each one moved), alternating the two kinds; prints
the median wall time of `Store.commit` and the mean CPU the Postgres server processes used for it (a mean: the
kernel counts CPU time in 10-ms ticks, finer only summed over many commits). Uses
`MIRUS_DATABASE_URL` when set (the CPU column then reads 0 unless the server runs on this machine), else a private
embedded Postgres on free ports (no Kafka needed).
"""

from __future__ import annotations

import argparse
import statistics
import time

import common

from replicator.state.store import Store

CONNECTOR = "commit-bench"


def run(store: Store, topics: int, partitions: int, rounds: int) -> None:
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
        cpu, wall = common.cpu_s(common.postgres_processes()), time.perf_counter()
        store.commit(lease, offsets, destinations)
        wall, cpu = time.perf_counter() - wall, common.cpu_s(common.postgres_processes()) - cpu
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
    with common.platform_database() as store:
        run(store, args.topics, args.partitions, args.rounds)


if __name__ == "__main__":
    main()
