"""How big the two images are, and how soon a replicator task container copies: from `docker run` to the task's
first committed offset.

    bash ../shared/containers/docker-up.sh                      # a Docker engine (host networking only)
    docker build --network host -f deploy/Dockerfile --target runtime -t mirus-dagster:local .
    docker build --network host -f deploy/Dockerfile --target spark -t mirus-dagster-spark:local .
    python benchmarks/container_start.py [--rounds 3] [--records 1000]

Two Apache Kafka 1.0 clusters from the kit (`mirus.faults.brokers.KafkaKit`, free ports, as the test suite starts
them) and the embedded Postgres (or MIRUS_DATABASE_URL). Each round, for each image in turn (the order alternates
between rounds, so neither always starts on a warmer machine): a new connector with default settings is stored,
its one source partition holding `--records` records, and the clock starts as `docker run --network host IMAGE
mirus task run CONNECTOR 0` is invoked; it stops when the task's first offset is in Postgres (the task commits every
`offset.flush.interval.ms`, 1 s by default, once the copies are acknowledged). Reported: seconds from `docker run`
and from the container's start (Docker's `State.StartedAt`); the median per image over the rounds. Target: first
commit within 5 s of the container's start, for the runtime image. The container is then stopped (SIGTERM: the task
flushes, commits and ends) and removed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import apache_kafka as kit
import common

from mirus.waiting import wait_until
from mirus_dagster.constants import ENV_DATABASE_URL
from replicator.state.store import Store

IMAGES = ("mirus-dagster:local", "mirus-dagster-spark:local")
TARGET_S = 5.0


@dataclass
class Start:
    image: str
    from_run_s: float  # `docker run` invoked -> first commit
    from_start_s: float  # the container's start (State.StartedAt) -> first commit


def image_size_mb(image: str) -> float:
    size = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Size}}", image], capture_output=True, text=True, check=True
    )
    return int(size.stdout) / 1e6


def started_at(container: str) -> float:
    """Docker's record of when the container's process started, as a Unix time (nanoseconds cut to micro)."""
    stamp = subprocess.run(
        ["docker", "inspect", "--format", "{{.State.StartedAt}}", container], capture_output=True, text=True, check=True
    ).stdout.strip()
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{whole}.{(fraction + '000000')[:6]}+00:00").timestamp()


def preloaded_connector(store: Store, source: str, destination: str, name: str, records: int) -> None:
    """A connector copying a one-partition topic holding `records` records to the same name at the destination, its
    one task assigned the partition."""
    topic = f"{name}-t"
    # The destination topic too: outside Dagster, no metadata watcher creates it.
    for cluster in (source, destination):
        common.create_topic(cluster, topic)
    kit.load(source, topic, records, 1, size=8)
    kit.put_engine_connector(store, name, topic, "", 1, 1, source=source, destination=destination)


def first_commit(store: Store, image: str, name: str, database_url: str) -> Start:
    env = {**os.environ, ENV_DATABASE_URL: database_url}  # passed by name: the URL never enters an argument
    argv = ["docker", "run", "-d", "--network", "host", "--name", name, "-e", ENV_DATABASE_URL, image]
    invoked = time.time()
    container = subprocess.run(
        [*argv, "mirus", "task", "run", name, "0"], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        try:
            wait_until(lambda: any(store.load_offsets(name).values()), 120, 0.02, f"{name}'s first commit")
        except TimeoutError:
            logs = subprocess.run(["docker", "logs", "--tail", "30", container], capture_output=True, text=True)
            raise RuntimeError(f"{name}: no commit; its container printed:\n{logs.stdout}{logs.stderr}") from None
        committed = time.time()
        return Start(image, committed - invoked, committed - started_at(container))
    finally:
        subprocess.run(["docker", "stop", "-t", "20", container], capture_output=True, check=False)
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=1000)
    args = parser.parse_args()
    for image in IMAGES:
        print(f"{image}: {image_size_mb(image):.0f} MB", flush=True)

    starts: list[Start] = []
    with (
        tempfile.TemporaryDirectory() as state,
        kit.private_clusters(Path(state) / "kafka") as (_, source, destination),
        common.platform_database() as store,
    ):
        database_url = store.engine.url.render_as_string(hide_password=False)
        prefix = f"start-{int(time.time())}"
        for round_ in range(args.rounds):
            order = IMAGES if round_ % 2 == 0 else IMAGES[::-1]
            for image in order:
                name = f"{prefix}-{round_}-{'spark' if 'spark' in image else 'runtime'}"
                preloaded_connector(store, source, destination, name, args.records)
                start = first_commit(store, image, name, database_url)
                starts.append(start)
                print(
                    f"  round {round_ + 1} {image}: first commit {start.from_run_s:.2f} s after `docker run`, "
                    f"{start.from_start_s:.2f} s after the container started (load {common.load_average():.1f})",
                    flush=True,
                )
    print()
    for image in IMAGES:
        mine = [s for s in starts if s.image == image]
        run_median = statistics.median(s.from_run_s for s in mine)
        start_median = statistics.median(s.from_start_s for s in mine)
        verdict = "met" if start_median <= TARGET_S else "NOT MET"
        print(
            f"{image}: median {run_median:.2f} s from `docker run`, {start_median:.2f} s from the container's start "
            f"(target <= {TARGET_S:.0f} s: {verdict})"
        )


if __name__ == "__main__":
    main()
