"""What a task's destination producers cost over thousands of partitions: one producer, or one per group of topics.

    python benchmarks/producer_groups.py --prefix TOPIC_PREFIX [--topics 20] [--partitions 500] [--rounds 3]
        [--groups 10000,2000,500] [--rate 2000]

Needs the two Apache Kafka 1.0 clusters running (see `benchmarks/apache_kafka.py`) and `--topics` topics of
`--partitions` partitions named `PREFIX-000` … on the destination cluster (e.g. those `estate.py` created; a kit
broker holds one set of 10,000 partitions). Producers are made as a task makes them (the engine's producer settings
and `DestinationProducers`, with `PARTITIONS_PER_PRODUCER` set to each `--groups` value: 10,000 = one producer), and
`spread` contrasts groups that split every topic (a partition's producer chosen by its number, so each producer
knows every topic). Per round, alternating the layouts:
- burst: one 100-byte record to every partition, until all are acknowledged: seconds and CPU-seconds;
- rate: `--rate` records/s spread evenly over every partition for 10 s: CPU (% of a core) and the records still
  unacknowledged at the end (a layout that cannot keep up leaves thousands).
CPU is this process's (librdkafka's threads included), from getrusage.
"""

from __future__ import annotations

import argparse
import time
from statistics import median

import apache_kafka as kit
import common
from apache_kafka import DESTINATION, SOURCE
from confluent_kafka import Producer

from replicator.configuration.connector import validate_submission
from replicator.engine import deliveries as producers

VALUE = b"x" * 100


def layout(
    targets: list[tuple[str, int]], group: int | None, spread: int | None
) -> tuple[list[Producer], list[Producer]]:
    """The producers, and each target's producer (in the order of `targets`)."""
    settings = validate_submission(
        {
            "name": "groups",
            "consumer.bootstrap.servers": SOURCE,
            "destination.consumer.bootstrap.servers": DESTINATION,
            "topics.whitelist": "groups",
        }
    ).producer_settings(0)
    widths: dict[str, int] = {}
    for topic, _ in targets:
        widths[topic] = widths.get(topic, 0) + 1
    if spread:
        made = [Producer({**settings, "log_level": 3}) for _ in range(spread)]
        return made, [made[partition % spread] for _, partition in targets]
    producers.PARTITIONS_PER_PRODUCER = group or 1 << 30
    grouped = producers.DestinationProducers(
        lambda: Producer({**settings, "log_level": 3}), grouped=True, idle_close_s=float("inf")
    )
    chosen = [grouped.open(grouped.index_for(topic, widths[topic])) for topic, _ in targets]
    return [p for p in grouped.all if p is not None], chosen


def unacknowledged(made: list[Producer]) -> int:
    return sum(len(p) for p in made)


def burst(targets: list[tuple[str, int]], made: list[Producer], routes: list[Producer]) -> tuple[float, float]:
    started, cpu = time.monotonic(), common.own_cpu_s()
    for (topic, partition), producer in zip(targets, routes, strict=True):
        producer.produce(topic, VALUE, None, partition)
    while unacknowledged(made):
        for producer in made:
            producer.poll(0.005)
    return time.monotonic() - started, common.own_cpu_s() - cpu


def at_rate(
    targets: list[tuple[str, int]], made: list[Producer], routes: list[Producer], rate: int, seconds: float = 10.0
) -> tuple[float, int]:
    started, cpu, sent = time.monotonic(), common.own_cpu_s(), 0
    while (elapsed := time.monotonic() - started) < seconds:
        while sent < int(elapsed * rate):
            i = sent % len(targets)
            routes[i].produce(targets[i][0], VALUE, None, targets[i][1])
            sent += 1
        for producer in made:
            producer.poll(0)
        time.sleep(max(sent / rate - (time.monotonic() - started), 0) + 0.005)
    share, left = (common.own_cpu_s() - cpu) / (time.monotonic() - started), unacknowledged(made)
    while unacknowledged(made):
        for producer in made:
            producer.poll(0.05)
    return share, left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--topics", type=int, default=20)
    parser.add_argument("--partitions", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--groups", default="10000,2000,500", help="partitions per producer, one layout each")
    parser.add_argument("--rate", type=int, default=2000)
    args = kit.parse_args(parser)
    # One partition after another over every topic, as evenly loaded partitions arrive.
    targets = [(f"{args.prefix}-{i:03d}", p) for p in range(args.partitions) for i in range(args.topics)]
    layouts: list[tuple[str, int | None, int | None]] = [
        (f"groups of {g}", int(g), None) for g in args.groups.split(",")
    ]
    layouts.append(("spread over 20", None, 20))
    results: dict[str, list[tuple[float, float, float, int]]] = {name: [] for name, _, _ in layouts}
    for round_ in range(args.rounds):
        for name, group, spread in layouts if round_ % 2 == 0 else layouts[::-1]:
            made, routes = layout(targets, group, spread)
            for producer in made:
                producer.list_topics(timeout=30)
            wall, cpu = burst(targets, made, routes)
            share, left = at_rate(targets, made, routes, args.rate)
            results[name].append((wall, cpu, share, left))
            print(
                f"round {round_ + 1}  {name:<16} {len(made):>3} producer(s): burst {wall:5.2f} s, {cpu:5.2f} CPU-s | "
                f"{args.rate:,}/s: {share:6.1%} of a core, {left:,} unacknowledged at the end",
                flush=True,
            )
            del made, routes
    print("medians:")
    for name, runs in results.items():
        print(
            f"  {name:<16} burst {median(r[0] for r in runs):5.2f} s, {median(r[1] for r in runs):5.2f} CPU-s | "
            f"{args.rate:,}/s: {median(r[2] for r in runs):6.1%} of a core, "
            f"{median(r[3] for r in runs):,.0f} unacknowledged"
        )


if __name__ == "__main__":
    main()
