"""What a kill -9 of a task re-sends on Apache Kafka, at the default and with `start.after.destination.copies`.

    python benchmarks/resend_on_kill.py [--rounds 3] [--backlog 400000] [--rate 2000] [--partitions 8]

Needs the two Apache Kafka 1.0 clusters of the kit running (see `benchmarks/apache_kafka.py`). Per round, each
setting in turn (alternating), two scenarios, each on a topic of its own and one connector (`tasks.max` 1) run as
`mirus task run`:
- catch-up: `--backlog` 100-byte records wait in the source; the task is killed once half of them are at the
  destination and it has committed once, and a new process finishes the copy;
- steady: a load of `--rate` records/s runs for 20 s; the task, caught up, is killed 10 s in and a new process
  started at once.
Prints per kill: the records copied but not committed when the task died (what a re-send can be at most), the
records the destination then holds more than the source (re-sent: Apache Kafka's high watermarks are exact), what
the new process counted (`mirus_records_resent_total`, from its run's events), and how long its look-up of the
copies took; then the medians per setting and scenario.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from uuid import uuid4

import apache_kafka as kit
import common
from apache_kafka import DESTINATION, SOURCE
from confluent_kafka import Producer

from mirus.waiting import wait_until
from replicator.state.store import Store

SETTINGS = {"default": False, "start.after.destination.copies": True}
FOUND = re.compile(
    r"(re-sending|resuming after) (\d+) record\(s\) copied since the last commit,? \(?found in ([\d.]+)s"
)


@dataclass
class Kill:
    setting: str
    scenario: str
    uncommitted: int  # copied but not committed at the kill
    resent: int  # what the destination holds beyond the source
    counted: int  # what the new process reported
    lookup_s: float | None


def ends(bootstrap: str, topic: str, partitions: int) -> int:
    return common.end_offsets(bootstrap, [topic], partitions)[topic]


def start_task(url: str, connector: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "MIRUS_DATABASE_URL": url}
    return common.start_process(common.task_argv(connector), env, log=log, cwd=common.ROOT)


def steady_load(topic: str, partitions: int, rate: int, seconds: float) -> threading.Thread:
    def run() -> None:
        producer = Producer({"bootstrap.servers": SOURCE, "linger.ms": 5})
        started, sent = time.monotonic(), 0
        while (elapsed := time.monotonic() - started) < seconds:
            for _ in range(int(elapsed * rate) - sent):
                producer.produce(topic, b"x" * 100, partition=sent % partitions)
                sent += 1
            producer.poll(0.005)
        producer.flush(60)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def one_kill(store: Store, url: str, setting: str, scenario: str, args: argparse.Namespace, work: Path) -> Kill:
    name = f"resend-{scenario}-{uuid4().hex[:8]}"
    for bootstrap in (SOURCE, DESTINATION):
        common.create_topic(bootstrap, name, args.partitions)
    kit.put_engine_connector(
        store, name, name, "", args.partitions, 1, **{"start.after.destination.copies": str(SETTINGS[setting]).lower()}
    )
    load = None
    if scenario == "catch-up":
        kit.load(SOURCE, name, args.backlog, args.partitions, 100)
        first = start_task(url, name, work / f"{name}-first.log")
        wait_until(
            lambda: common.committed(store, name) > 0 and ends(DESTINATION, name, args.partitions) >= args.backlog // 2,
            timeout=300,
            interval=0.01,
        )
    else:
        load = steady_load(name, args.partitions, args.rate, 20.0)
        first = start_task(url, name, work / f"{name}-first.log")
        time.sleep(10)  # the kill lands at a moment of the load's choosing, not at a condition
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    uncommitted = ends(DESTINATION, name, args.partitions) - common.committed(store, name)
    second = start_task(url, name, work / f"{name}-second.log")
    if load is not None:
        load.join()
    total = ends(SOURCE, name, args.partitions)
    wait_until(lambda: common.committed(store, name) >= total, timeout=600, interval=0.2)
    second.send_signal(signal.SIGINT)
    second.wait(60)
    events = (work / f"{name}-second.log").read_text()
    found = FOUND.search(events)
    counted = int(found.group(2)) if found and found.group(1) == "re-sending" else 0
    return Kill(
        setting,
        scenario,
        uncommitted,
        ends(DESTINATION, name, args.partitions) - total,
        counted,
        float(found.group(3)) if found else None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backlog", type=int, default=400_000)
    parser.add_argument("--rate", type=int, default=2_000)
    parser.add_argument("--partitions", type=int, default=8)
    args = kit.parse_args(parser)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"resend-{uuid4().hex[:6]}"
    work.mkdir(parents=True)
    kills: list[Kill] = []
    with common.platform_database() as store:
        url = store.engine.url.render_as_string(hide_password=False).replace("+psycopg2", "")
        print(f"{'setting':<34} {'scenario':<9} {'uncommitted':>11} {'re-sent':>8} {'counted':>8} {'look-up s':>9}")
        for _ in range(args.rounds):
            for scenario in ("catch-up", "steady"):
                for setting in SETTINGS:
                    k = one_kill(store, url, setting, scenario, args, work)
                    kills.append(k)
                    lookup = f"{k.lookup_s:.2f}" if k.lookup_s is not None else "-"
                    print(
                        f"{k.setting:<34} {k.scenario:<9} {k.uncommitted:>11,} {k.resent:>8,} {k.counted:>8,} "
                        f"{lookup:>9}",
                        flush=True,
                    )
    print("medians:")
    for scenario in ("catch-up", "steady"):
        for setting in SETTINGS:
            mine = [k for k in kills if k.setting == setting and k.scenario == scenario]
            lookups = [k.lookup_s for k in mine if k.lookup_s is not None]
            uncommitted = statistics.median(k.uncommitted for k in mine)
            resent = statistics.median(k.resent for k in mine)
            counted, lookup = statistics.median(k.counted for k in mine), statistics.median(lookups or [float("nan")])
            print(f"{setting:<34} {scenario:<9} {uncommitted:>11,.0f} {resent:>8,.0f} {counted:>8,.0f} {lookup:>9.2f}")
    print(f"(task logs in {work})")


if __name__ == "__main__":
    main()
