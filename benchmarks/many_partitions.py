"""One connector over 10,000 source partitions, on Apache Kafka: the monitor's cycle and a task's memory.

    python benchmarks/many_partitions.py [--topics 20] [--partitions 500] [--tasks 4]

Needs the two Apache Kafka 1.0 clusters running (see `benchmarks/apache_kafka.py`). Creates `--topics` topics of
`--partitions` partitions on the source (one record in each partition, so every partition is fetched and
committed) and one single-partition topic per source topic on the destination (records go through the producer's
partitioner). Then:
- times `KafkaMonitor.poll` (what the metadata watcher runs per connector): the first cycle, which writes
  the assignment, and steady cycles that find nothing changed;
- starts task 0 (`mirus task run`, owning 1/tasks of the partitions) and reports its resident memory and CPU once
  it has committed an offset for every partition it owns, and again while idle.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import apache_kafka as kit
import common
import psutil
from apache_kafka import DESTINATION, SOURCE

from replicator.configuration.connector import validate_submission
from replicator.discovery.monitor import KafkaMonitor


def create_wide_topics(prefix: str, topics: int, partitions: int) -> list[str]:
    """The topics on the source (a record in every partition) and namesakes of one partition at the destination."""
    names = [f"{prefix}-{i:03d}" for i in range(topics)]
    for bootstrap, count in ((SOURCE, partitions), (DESTINATION, 1)):
        # One request each: a broker creates thousands of partitions slowly.
        common.create_topics(bootstrap, dict.fromkeys(names, count), batch=1, timeout_s=600, poll_s=1.0)
    kit.fill(names, partitions)
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=20)
    parser.add_argument("--partitions", type=int, default=500)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--prefix", help="reuse the topics of an earlier run (they are deleted at the end)")
    args = kit.parse_args(parser)
    prefix = args.prefix or f"wide{int(time.time())}"
    total = args.topics * args.partitions
    print(f"creating {args.topics} topics x {args.partitions} partitions ({total:,}) ...", flush=True)
    started = time.perf_counter()
    names = create_wide_topics(prefix, args.topics, args.partitions)
    print(f"  created and filled in {time.perf_counter() - started:.0f} s (load average {common.load_average():.1f})")

    with common.platform_database() as store:
        name = f"{prefix}-connector"
        config = validate_submission(
            {
                "name": name,
                "consumer.bootstrap.servers": SOURCE,
                "destination.consumer.bootstrap.servers": DESTINATION,
                "topics.regex": f"{prefix}-.*",
                "tasks.max": args.tasks,
            }
        )
        store.put_connector(name, config.raw, args.tasks)
        monitor = KafkaMonitor(store)
        for cycle in range(4):
            t = time.perf_counter()
            result = monitor.poll(name)
            owned = {task: len(tps) for task, tps in result.tasks.items()}
            print(
                f"monitor cycle {cycle + 1}: {time.perf_counter() - t:.2f} s (new generation: {result.changed}; "
                f"partitions per task {owned}; load average {common.load_average():.1f})",
                flush=True,
            )

        env = {**os.environ, "MIRUS_DATABASE_URL": store.engine.url.render_as_string(hide_password=False)}
        mine = set(result.tasks[0])
        proc = common.start_process(common.task_argv(name), env)
        started = time.perf_counter()
        try:
            while len(set(store.load_offsets(name)) & mine) < len(mine):
                if proc.poll() is not None:
                    raise RuntimeError(f"task 0 exited with {proc.returncode}")
                time.sleep(1)
            task = psutil.Process(proc.pid)
            print(
                f"task 0 owns {len(mine):,} partitions: every one committed after "
                f"{time.perf_counter() - started:.0f} s; resident memory {common.rss_mib([task]):.0f} MiB"
            )
            time.sleep(10)
            cpu = common.cpu_s([task])
            time.sleep(20)
            busy = common.cpu_s([task]) - cpu
            print(
                f"  idle: resident memory {common.rss_mib([task]):.0f} MiB, CPU {busy / 20:.0%} of a core "
                f"(load average {common.load_average():.1f})"
            )
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(120)
    common.delete_topics(SOURCE, names)
    common.delete_topics(DESTINATION, names)


if __name__ == "__main__":
    main()
