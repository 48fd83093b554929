"""End-to-end latency at steady traffic: the engine against Apache MirrorMaker 1.0, on Apache Kafka.

    python benchmarks/latency_vs_mirrormaker.py [--rates 1000,5000,20000,50000] [--seconds 12] [--rounds 1]
        [--copiers engine,mirrormaker] [--topics 1] [--partitions 4] [--engine-property KEY=VALUE ...]
        [--baseline OTHER_CHECKOUT] [--load librdkafka|kafka-python]

Needs the two Apache Kafka 1.0 clusters running (see `benchmarks/apache_kafka.py`). For every rate and copier:
fresh topics (`--topics` of `--partitions`: one of 4 by default); the copier is started and proven to flow (one
record through); then a load process writes 100-byte records at a steady rate for `--seconds`, spread evenly over
every partition (`--load`: librdkafka, a producer per topic; kafka-python, one producer whose requests carry every
partition, for many partitions), and this process reads the destination. Copiers alternate at each rate
(order flips every round). Copiers: `mirrormaker` (the kit's), `engine` and `engine-*` (`apache_kafka.ENGINE_COPIERS`,
e.g. `engine-batches`), `engine-baseline`. A copier's CPU is shown as its share of a core while the load's records
come through (from the load's start until the last arrived), and in CPU-s over its whole run.

The clock starts at the record's CreateTime (set by librdkafka in the load process when `produce()` is called)
and stops when this process's consumer on the destination receives the record (`time.time()` when `consume()`
returns). Both processes read the same machine clock, so there is no skew. The first 2 s of every run are
dropped. The load and this process run at niceness -10 (copiers and brokers at 0), which puts them first only
with the kernel's autogroup scheduling off (the script warns otherwise). The measuring path's own latency (load
producer with linger 1 ms → broker → this consumer) is measured the same way with no copier, by reading the
source topic itself ("direct"): it is part of every figure.
For the engine, its own metric (source CreateTime → destination acknowledgement, `metric_samples`) is shown
next to the external measurement. After the last round, the median over the rounds of each percentile, per rate
and copier.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from bisect import bisect_left
from pathlib import Path
from statistics import median

import apache_kafka as kit
import common
import psutil
from apache_kafka import DESTINATION, SOURCE
from confluent_kafka import Consumer, Producer, TopicPartition

from replicator.engine.metrics import BUCKET_LABELS
from replicator.state.store import Store

WARMUP_S = 2.0
WARM_ABOVE_PARTITIONS = 100  # shapes with more partitions get a first record in each before the clock runs
# The load producer and the reading consumer run ahead of everything else on the machine (brokers and copiers at
# the default 0), so their own scheduling delays stay out of the figures as far as the kernel allows.
MEASURING_NICENESS = -10
# With autogroup scheduling, every session is a group that shares the cores equally with the others, whatever its
# processes' niceness: the load (its own session) would not run ahead, and the copier (its own session) would get a
# third of the machine while the brokers shared another third.
AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")


def disk_warning() -> str | None:
    """Why a thousand partitions' latency would be the disk's on this machine, if it would."""
    log_dirs = [
        line.split("=", 1)[1].split(",")
        for arg in kit.broker_process("a").cmdline() if arg.endswith("server-a.properties")
        for line in Path(arg).read_text().splitlines() if line.startswith("log.dirs=")
    ]  # fmt: skip
    mounts = sorted(psutil.disk_partitions(all=True), key=lambda m: len(m.mountpoint), reverse=True)
    on_disk = [
        d for dirs in log_dirs for d in dirs
        if next((m.fstype for m in mounts if d.startswith(m.mountpoint)), "") != "tmpfs"
    ]  # fmt: skip
    if on_disk:
        return (
            f"warning: the source broker's log.dirs {', '.join(on_disk)} are not on tmpfs: over a thousand partitions "
            "this machine's disk holds every append for seconds (start the kit with KAFKA_WORK=/dev/shm/kit)"
        )
    return None


def autogroup_warning() -> str | None:
    """Why the measuring processes' niceness would not put them first on this machine, if it would not."""
    if AUTOGROUP.exists() and AUTOGROUP.read_text().strip() != "0":
        return (
            "warning: kernel.sched_autogroup_enabled=1, so the measuring processes' niceness does not put them "
            "ahead of the copier and brokers; `sysctl -w kernel.sched_autogroup_enabled=0` (as root) first"
        )
    return None


def load_steady(topics: list[str], partitions: int, rate: int, seconds: float, client: str = "librdkafka") -> None:
    """Write `rate` records/s for `seconds`, one partition after another over every partition of `topics`, CreateTime
    = the moment of the send. `librdkafka`: a producer per topic (one librdkafka producer sends a produce request per
    partition from one thread, librdkafka issue #1700, which over a thousand partitions falls behind by itself: seconds
    behind at 5,000 records/s over 1,000 partitions here); `kafka-python`: one producer whose requests carry every
    partition of a broker, as the Java client's do."""
    targets = [(topic, p) for p in range(partitions) for topic in topics]
    value, sent, start, total = b"v" * 100, 0, time.perf_counter(), int(rate * seconds)
    if client == "kafka-python":
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=SOURCE, linger_ms=1, acks="all", max_block_ms=30_000)
        for topic in topics:  # metadata (and the broker's connection) first: not in the first records' clock
            producer.partitions_for(topic)
        start = time.perf_counter()
        while sent < total:
            due = min(int((time.perf_counter() - start) * rate), total)
            while sent < due:
                topic, partition = targets[sent % len(targets)]
                producer.send(topic, value, partition=partition)
                sent += 1
            time.sleep(0.0005)
        producer.flush(30)
        producer.close()
        return
    settings = {"bootstrap.servers": SOURCE, "linger.ms": 1, "queue.buffering.max.messages": 1_000_000}
    producers = {topic: Producer(settings) for topic in topics}
    produce = {topic: producer.produce for topic, producer in producers.items()}
    while sent < total:
        due = min(int((time.perf_counter() - start) * rate), total)
        while sent < due:
            topic, partition = targets[sent % len(targets)]
            try:
                # Positional: keyword arguments cost the load process a third of its CPU at 100,000 records/s,
                # which the copier under test would otherwise not have.
                produce[topic](topic, value, None, partition)
            except BufferError:
                producers[topic].poll(0.001)
                continue
            sent += 1
        for producer in producers.values():
            producer.poll(0)
        time.sleep(0.0005)
    for producer in producers.values():
        producer.flush(30)


def reader(bootstrap: str, topics: list[str], partitions: int, start: int = 0) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"latency-{topics[0]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    consumer.assign([TopicPartition(topic, p, start) for topic in topics for p in range(partitions)])
    return consumer


def measure(consumer: Consumer, expected: int, timeout_s: float) -> list[tuple[int, int]]:
    """(CreateTime, arrival) in ms of every record until `expected` arrived or `timeout_s` passed."""
    batches: list[tuple[int, list[int]]] = []  # paired per record only afterwards: reading stays cheap
    count, deadline = 0, time.monotonic() + timeout_s
    while count < expected and time.monotonic() < deadline:
        msgs = consumer.consume(10_000, 0) or consumer.consume(1, 0.1)  # never wait for more than one record
        now = time.time_ns() // 1_000_000
        created = [m.timestamp()[1] for m in msgs if m.error() is None]
        batches.append((now, created))
        count += len(created)
    return [(c, now) for now, created in batches for c in created]


def percentiles(latencies: list[int]) -> dict[str, float]:
    ordered = sorted(latencies)
    pick = lambda q: ordered[min(int(q * len(ordered)), len(ordered) - 1)]  # noqa: E731
    return {
        "p50": pick(0.5),
        "p99": pick(0.99),
        "p99.9": pick(0.999),
        "max": ordered[-1],
        "n": len(ordered),
        "mean": sum(ordered) / len(ordered),
    }


def engine_metric(store: Store, connector: str) -> str:
    """The engine's own latency metric over the run: mean, max and the histogram's p50/p99 bucket bounds."""
    samples = store.metric_samples(connector)
    count = sum(s["latency_count"] for s in samples)
    if not count:
        return "no samples"
    total = sum(s["latency_sum_ms"] for s in samples)
    top = max(s["latency_max_ms"] or 0 for s in samples)
    cumulative = [sum(s["latency_histogram"][label] for s in samples) for label in BUCKET_LABELS]
    bound = lambda q: BUCKET_LABELS[bisect_left(cumulative, q * count)]  # noqa: E731
    return f"mean {total / count:.0f} ms, p50 <= {bound(0.5)} ms, p99 <= {bound(0.99)} ms, max {top} ms ({count:,})"


def one_run(
    store: Store,
    env: dict[str, str],
    copier: str,
    rate: int,
    seconds: float,
    tag: str,
    engine: dict[str, str],
    shape: tuple[int, int] = (1, 4),
    baseline: str | None = None,
    load_client: str = "librdkafka",
) -> tuple[str, dict[str, float]]:
    """One copier at one rate: the printed line, its percentiles and its share of a core (`cpu`); `engine`: connector
    properties the engine's connector gets beside its defaults and its copier's; `shape`: how many topics, of how
    many partitions; `baseline`: the checkout `engine-baseline` runs from."""
    count, partitions = shape
    name = f"lat-{tag}-{copier}-{rate}"
    topics = [name] if count == 1 else [f"{name}-{i}" for i in range(count)]
    common.create_topics(SOURCE, dict.fromkeys(topics, partitions), timeout_s=600)
    targets, bootstrap = topics, SOURCE
    argvs: list[list[str]] = []
    if copier != "direct":
        targets = topics if copier == "mirrormaker" else [f"{t}.engine" for t in topics]  # MirrorMaker keeps names
        bootstrap = DESTINATION
        common.create_topics(DESTINATION, dict.fromkeys(targets, partitions), timeout_s=600)
    if copier == "mirrormaker":
        argvs = kit.mirrormaker_argv("|".join(topics))
    elif copier != "direct":
        properties = {**kit.ENGINE_COPIERS.get(copier, {}), **engine}
        kit.put_engine_connector(store, name, ",".join(topics), ".engine", partitions, 1, **properties)
        argvs = kit.engine_argv(name, 1)
        if copier == "engine-baseline" and baseline:
            argvs = kit.baseline_argvs(baseline, argvs, env["MIRUS_DATABASE_URL"])
    # Over many partitions, a record in each first, copied before the clock runs: a broker's first append to a
    # partition makes its segment and index files (seconds over a thousand fresh partitions, on either cluster).
    warm = len(topics) * partitions > WARM_ABOVE_PARTITIONS
    if warm:
        first = Producer({"bootstrap.servers": SOURCE, "linger.ms": 5})
        for topic in topics:
            for p in range(partitions):
                first.produce(topic, b"first", partition=p)
        first.flush(60)
    if warm:  # the brokers' work of making a thousand partitions, done before anything is timed
        kit.wait_for_quiet_brokers()
    procs = [common.start_process(argv, env) for argv in argvs]
    if warm:
        common.wait_until(
            lambda: all(n >= partitions for n in common.end_offsets(bootstrap, targets, partitions).values()),
            300, 0.5, f"{copier}: a first record in every partition",
        )  # fmt: skip
    consumer = reader(bootstrap, targets, partitions, start=1 if warm else 0)
    try:
        ping = Producer({"bootstrap.servers": SOURCE})
        ping.produce(topics[0], b"ping", partition=0)
        ping.flush(30)
        pinged = measure(consumer, 1, 120)
        if not pinged:
            raise TimeoutError(f"{copier} did not forward a first record within 120 s")
        load_avg = common.load_average()
        watched = [psutil.Process(p.pid) for p in procs]
        loader = common.start_process(
            [sys.executable, __file__, "load", ",".join(topics), str(partitions), str(rate), str(seconds), load_client],
            env,
            niceness=MEASURING_NICENESS,
        )
        cpu_before, started = common.cpu_s(watched), time.perf_counter()
        seen = measure(consumer, int(rate * seconds), seconds + 60)
        share = (common.cpu_s(watched) - cpu_before) / (time.perf_counter() - started)
        loader.wait(60)
    finally:
        consumer.close()
        for p in procs:
            p.send_signal(signal.SIGTERM if copier == "mirrormaker" else signal.SIGINT)
        cpu = sum(kit.reap(p) for p in procs)
    first = min(created for created, _ in seen)
    kept = [arrived - created for created, arrived in seen if created >= first + WARMUP_S * 1000]
    stats = {**percentiles(kept), "cpu": share}
    line = (
        f"{rate:>7,}/s {copier:<15} p50 {stats['p50']:>5.0f}  p99 {stats['p99']:>5.0f}  "
        f"p99.9 {stats['p99.9']:>5.0f}  max {stats['max']:>5.0f} ms  (mean {stats['mean']:.0f}; "
        f"{stats['n']:,} records; load avg {load_avg:.1f}"
        + (f"; copier {share:.1%} of a core under load, {cpu:.1f} CPU-s in all)" if procs else ")")
    )
    if copier.startswith("engine"):
        every = percentiles([arrived - created for created, arrived in pinged + seen])
        line += (
            f"\n{'':>25}all records, external: mean {every['mean']:.0f} ms, max {every['max']:.0f} ms; "
            f"engine's own metric: {engine_metric(store, name)}"
        )
    common.delete_topics(SOURCE, topics)
    if copier != "direct":
        common.delete_topics(DESTINATION, targets)
    if warm:
        kit.wait_for_quiet_brokers()
    return line, stats


def summary(runs: dict[tuple[int, str], list[dict[str, float]]]) -> str:
    """Per rate and copier, the median over the rounds of each percentile and of the copier's share of a core under
    load (one round's figures swing with the machine: the direct path alone has gone from p99 12 ms to 180 ms between
    two runs a minute apart)."""
    rounds = max(len(v) for v in runs.values())
    header = f"{'rate':>9} {'copier':<15} {'p50':>5} {'p99':>5} {'p99.9':>6} {'max':>5} {'CPU':>6}   p99 of each round"
    lines = [f"median of {rounds} rounds, per rate and copier (ms; CPU: the copier's share of a core)", header]
    for (rate, copier), stats in sorted(runs.items(), key=lambda kv: (kv[0][0], kv[0][1] != "direct", kv[0][1])):
        med = {k: median(s[k] for s in stats) for k in ("p50", "p99", "p99.9", "max", "cpu")}
        each = " / ".join(f"{s['p99']:.0f}" for s in stats)
        cpu = f"{med['cpu']:>6.1%}" if copier != "direct" else f"{'':>6}"
        lines.append(
            f"{rate:>7,}/s {copier:<15} {med['p50']:>5.0f} {med['p99']:>5.0f} {med['p99.9']:>6.0f} "
            f"{med['max']:>5.0f} {cpu}   {each}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="1000,5000,20000,50000")
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--copiers",
        default="engine,mirrormaker",
        help="also: engine-batches (copy.mode=batches), engine-baseline (the engine of --baseline)",
    )
    parser.add_argument("--topics", type=int, default=1, help="source topics per copier and rate")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of each topic")
    parser.add_argument(
        "--baseline",
        help="another checkout of the project (a commit to compare with, side by side): "
        "engine-baseline runs the engine from there",
    )
    parser.add_argument(
        "--load",
        choices=("librdkafka", "kafka-python"),
        default="librdkafka",
        help="the load's client: kafka-python for many partitions (librdkafka sends a request per partition)",
    )
    parser.add_argument(
        "--engine-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a connector property for the engine (e.g. consumer.fetch.wait.max.ms=100); repeatable",
    )
    args = kit.parse_args(parser)
    copiers = args.copiers.split(",")
    engine_properties = dict(kv.split("=", 1) for kv in args.engine_property)
    os.setpriority(os.PRIO_PROCESS, 0, MEASURING_NICENESS)  # the reading consumer (copiers are started at 0)
    if warning := autogroup_warning():
        print(warning, flush=True)
    if args.topics * args.partitions > WARM_ABOVE_PARTITIONS and (warning := disk_warning()):
        print(warning, flush=True)
    with common.platform_database() as store:
        env = {**os.environ, "MIRUS_DATABASE_URL": store.engine.url.render_as_string(hide_password=False)}
        tag = str(int(time.time()))
        runs: dict[tuple[int, str], list[dict[str, float]]] = {}
        for r in range(args.rounds):
            print(f"round {r + 1}: direct (no copier) is the measuring path's own latency", flush=True)
            for rate in [int(x) for x in args.rates.split(",")]:
                order = copiers if (r + rate // 1000) % 2 == 0 else copiers[::-1]
                for copier in ["direct", *order]:
                    line, stats = one_run(
                        store,
                        env,
                        copier,
                        rate,
                        args.seconds,
                        f"{tag}-{r}",
                        engine_properties,
                        (args.topics, args.partitions),
                        args.baseline,
                        args.load,
                    )
                    print(line, flush=True)
                    runs.setdefault((rate, copier), []).append(stats)
        print(summary(runs), flush=True)


if __name__ == "__main__" and sys.argv[1:2] == ["load"]:
    load_steady(sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), sys.argv[6])
elif __name__ == "__main__":
    main()
