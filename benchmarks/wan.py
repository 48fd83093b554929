"""The engine against Apache MirrorMaker 1.0 across a wide-area link: the destination 25 ms away each way.

    python benchmarks/wan.py [--rounds 3] [--sizes 100:1000000,1000:300000] [--delay-ms 25] [--copiers ...]

Starts its own ZooKeeper and two single-broker Apache Kafka 1.0 clusters from the kit's distribution
(`mirus.faults.brokers.KafkaKit`, free ports; `MIRUS_KAFKA_HOME` as the suite) and a delaying TCP proxy in front
of the destination, which advertises the proxy's port to clients: every byte a copier sends to the destination,
and every response, arrives `--delay-ms` later (`mirus.faults.proxy.TcpProxy`, `delay_s`; this kernel has no
netem). The proxy runs as its own process so that its CPU time is its own; it counts the bytes it forwards (the
bytes on the wire to the destination). The benchmark's own clients (preload, topic creation, the record count)
reach the destination through its second listener, directly.

Each round preloads a fresh source topic per record size (unique JSON-like records, so that compression sees
realistic data), then every copier copies it into its own destination topic, one after another: MirrorMaker and
the engine first, back to back, taking turns to go first, then the variants in an order that rotates by one
every round. Wall time runs from the copier's start until the destination's high watermarks
add up to every record; CPU is the copier's process CPU time (`os.wait4`), start-up included. Copiers:
`mirrormaker` (the kit's MirrorMaker 1.0 settings: 2 streams, acks=1, linger 5 ms, 64 KB batches; consuming the
source directly, producing through the link), `engine` (`mirus task run`, one task, a connector of default
settings), `engine-batches` (`copy.mode=batches`; its own client crosses the link as well: the destination's
metadata names the proxy's port) and `engine-*`, the engine with one producer setting changed (`VARIANTS`).

Prints the medians, the engine's throughput over MirrorMaker's, and exits 1 if that is below `--goal` (3) for
any record size. Waits (up to 20 minutes, polling every minute) for the 1-minute load average to drop to 3 before
measuring; every figure is printed with the load average at its start.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import resource
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import apache_kafka as kit
import common
from confluent_kafka import Consumer, KafkaError, Message, Producer

from mirus.faults.brokers import BrokerProcess, KafkaKit
from mirus.faults.proxy import TcpProxy
from replicator.configuration.connector import validate_submission

# The engine with one producer setting changed (connector properties, as an operator would set them), or with
# copy.mode=batches (batches fetched and produced as bytes, up to 5 produce requests in flight per leader). The
# engine's defaults: batch.size 1 MiB, linger.ms 5, compression none, and at most 5 requests in flight per connection
# (the most idempotence allows, which the engine needs for per-partition order without gaps).
VARIANTS: dict[str, dict[str, str]] = {
    "engine": {},
    "engine-batches": kit.ENGINE_COPIERS["engine-batches"],
    "engine-batch64k": {"producer.batch.size": "65536"},
    "engine-batch256k": {"producer.batch.size": "262144"},
    "engine-inflight1": {"producer.max.in.flight.requests.per.connection": "1"},
    "engine-inflight2": {"producer.max.in.flight.requests.per.connection": "2"},
    "engine-linger0": {"producer.linger.ms": "0"},
    "engine-linger50": {"producer.linger.ms": "50"},
    "engine-linger100": {"producer.linger.ms": "100"},
    "engine-none": {"producer.compression.type": "none"},
    "engine-lz4": {"producer.compression.type": "lz4"},
    "engine-zstd": {"producer.compression.type": "zstd"},
    "engine-gzip": {"producer.compression.type": "gzip"},  # what zstd would beat, where the destination has it
}
COPIERS = ["mirrormaker", *VARIANTS]
FILE_DELETE_DELAY_S = 62.0  # Kafka's file.delete.delay.ms (60 s), and a little more
LOAD_LIMIT = 3.0  # 1-minute load average above which the machine is too busy to measure on (2 cores)


@dataclass
class LinkRun(kit.Run):
    """A copier's run, and what crossed the link meanwhile."""

    wire_to: int  # bytes the proxy forwarded to the destination during the run
    wire_from: int  # and back
    proxy_cpu_s: float


@dataclass
class Sizes:
    value_bytes: int
    records: int
    runs: dict[str, list[LinkRun]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # copier -> why it could not run


# -- the delaying proxy, in its own process ---------------------------------------------------------------------


def serve_proxy(target_port: int, port: int, delay_ms: float) -> None:
    """`wan.py proxy TARGET PORT DELAY_MS`: forward PORT to TARGET with the delay; answer each `stats` line on
    stdin with a JSON line of the bytes forwarded and this process's CPU seconds; stop at end of input."""
    with TcpProxy(("127.0.0.1", target_port), port, delay_s=delay_ms / 1000) as proxy:
        print("ready", flush=True)
        for line in sys.stdin:
            if line.strip() == "stats":
                usage = resource.getrusage(resource.RUSAGE_SELF)
                stats = {
                    "to": proxy.bytes_to_target,
                    "from": proxy.bytes_from_target,
                    "cpu": usage.ru_utime + usage.ru_stime,
                    "connections": proxy.connections,
                }
                print(json.dumps(stats), flush=True)


class ProxyProcess:
    def __init__(self, target_port: int, port: int, delay_ms: float) -> None:
        self.port = port
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "proxy", str(target_port), str(port), str(delay_ms)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self._in, self._out = self.proc.stdin, self.proc.stdout
        if self._out.readline().strip() != "ready":
            raise RuntimeError("the delaying proxy did not start")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stats(self) -> dict[str, float]:
        self._in.write("stats\n")
        self._in.flush()
        return json.loads(self._out.readline())

    def close(self) -> None:
        self._in.close()
        self.proc.wait(10)


# -- the clusters -----------------------------------------------------------------------------------------------


@dataclass
class Clusters:
    home: Path
    source: str  # the source broker (never delayed: both copiers read it directly)
    destination: str  # what copiers use: the proxy's port, as the broker advertises it
    destination_direct: str  # the broker's second listener: preload, topic creation and the record count
    proxy: ProxyProcess


@contextmanager
def clusters(work: Path, delay_ms: float) -> Iterator[Clusters]:
    with ExitStack() as stack:
        target, proxy_port, internal = common.free_port(), common.free_port(), common.free_port()
        # The proxy first, so that the port the destination advertises is held before the broker starts.
        proxy = ProxyProcess(target, proxy_port, delay_ms)
        stack.callback(proxy.close)
        kafka = KafkaKit(work / "kafka", common.free_port())
        stack.callback(kafka.stop)
        kafka.start_zookeeper()
        source: BrokerProcess = kafka.broker("source", common.free_port(), None, common.free_port())
        destination = kafka.broker("destination", target, proxy_port, internal)
        source.start()
        destination.start()
        yield Clusters(kafka.home, source.bootstrap, proxy.address, f"127.0.0.1:{internal}", proxy)


def round_trip_ms(address: str, samples: int = 9) -> float:
    """The median time of an ApiVersions request and its response on one connection (what a produce request
    waits at least, whatever its size)."""
    host, port = address.split(":")
    request = struct.pack(">hhih", 18, 0, 1, 3) + b"rtt"  # ApiVersions v0, correlation id 1, client id "rtt"
    times = []
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(samples):
            start = time.perf_counter()
            sock.sendall(struct.pack(">i", len(request)) + request)
            size = struct.unpack(">i", _read(sock, 4))[0]
            _read(sock, size)
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return data


# -- the records ------------------------------------------------------------------------------------------------

_VOCABULARY = (
    "order paid shipped pending refund customer account invoice delivery express standard warehouse berlin paris "
    "london madrid gift card visa mastercard paypal discount coupon returned cancelled priority bulk fragile "
    "electronics books garden kitchen toys sports apparel shoes beauty grocery pharmacy subscription renewal trial"
)
WORDS = _VOCABULARY.split()


@functools.cache
def payloads(size: int, count: int = 65_536, seed: int = 7) -> list[bytes]:
    """`count` distinct JSON-like records of exactly `size` bytes: structured fields, then words (what an order
    or event topic holds; compresses about as much). A topic cycles through them: at 100 B a 1 MB batch of one
    partition spans 40,000 of them, so no batch repeats a record (which would flatter compression)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        text = (
            f'{{"id":{1_000_000 + i},"customer":"c{rng.randrange(100_000):06d}","sku":"SKU-{rng.randrange(5000):05d}",'
            f'"qty":{rng.randrange(1, 10)},"price":{rng.randrange(100, 100_000) / 100},'
            f'"ts":"2026-11-{rng.randrange(1, 29):02d}T{rng.randrange(24):02d}:{rng.randrange(60):02d}:'
            f'{rng.randrange(60):02d}.{rng.randrange(1000):03d}Z","note":"'
        )
        while len(text) < size:
            text += rng.choice(WORDS) + " "
        out.append(text[:size].encode())
    return out


def codec_refusal(proxy: ProxyProcess, topic: str, codec: str) -> str | None:
    """None if a producer asking for `codec` compresses what crosses the link, else why not. Apache Kafka 1.0 has
    no zstd (it came with 2.1): librdkafka then sends those batches uncompressed, with no error, so only the bytes
    on the wire tell (100 records of 8 KB that any codec shrinks tenfold)."""
    errors: list[str] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(str(err))

    before = proxy.stats()["to"]
    producer = Producer(
        {"bootstrap.servers": proxy.address, "compression.type": codec, "linger.ms": 50, "message.timeout.ms": 15_000}
    )
    for i in range(100):
        producer.produce(topic, b"probe %03d " % i * 800, on_delivery=delivered)
    producer.flush(30)
    sent = proxy.stats()["to"] - before
    if errors:
        return f"the destination refuses compression.type={codec}: {errors[0]}"
    if sent > 400_000:
        return (
            f"the destination does not take {codec} (Apache Kafka 1.0; zstd needs 2.1): librdkafka sends uncompressed"
        )
    return None


# -- the copiers ------------------------------------------------------------------------------------------------


def timed_copy_over_link(
    copier: str,
    argv: list[str],
    env: dict[str, str],
    stop: int,
    log: Path,
    counter: Consumer,
    target: str,
    partitions: int,
    records: int,
    proxy: ProxyProcess,
    timeout_s: float,
) -> LinkRun:
    """`apache_kafka.timed_copy` of one copier process, counted at the destination's direct listener, with the
    proxy's bytes and CPU over the run."""
    before = proxy.stats()
    run = kit.timed_copy(
        copier,
        [argv],
        target,
        partitions,
        records,
        env,
        stop,
        timeout_s,
        copied=lambda: common.records_in(counter, target, partitions),
        log=log,
    )
    after = proxy.stats()
    return LinkRun(
        **vars(run),
        wire_to=int(after["to"] - before["to"]),
        wire_from=int(after["from"] - before["from"]),
        proxy_cpu_s=after["cpu"] - before["cpu"],
    )


# -- measuring --------------------------------------------------------------------------------------------------


def wait_for_quiet(limit: float, poll_s: int, max_wait_s: int) -> None:
    """Others share this machine: wait (up to `max_wait_s`) for the 1-minute load average to drop to `limit`,
    then measure anyway; every figure carries its load average."""
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)
    waited = 0
    while os.getloadavg()[0] > limit and waited < max_wait_s:
        print(f"load average {os.getloadavg()[0]:.2f} > {limit}: waiting ({waited // 60} of {max_wait_s // 60} min)")
        time.sleep(poll_s)
        waited += poll_s
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)


def report(s: Sizes, partitions: int, delay_ms: float, rounds: int) -> float | None:
    """Print one record size's medians; return the engine's throughput over MirrorMaker's."""
    rtt = 2 * delay_ms
    print(
        f"\n{s.records:,} records x {s.value_bytes:,} B over {partitions} partitions, destination {delay_ms:g} ms "
        f"away each way ({rtt:g} ms RTT); median of {rounds} alternating runs"
    )
    print(
        f"{'copier':<18}{'wall s':>7}{'records/s':>11}{'x MM1':>7}{'CPU-s':>7}{'CPU-us/rec':>11}"
        f"{'MB to dest':>11}{'B/rec':>7}{'proxy CPU-s':>12}  load avg"
    )
    mm = s.runs.get("mirrormaker")
    mm_rate = s.records / statistics.median([r.wall_s for r in mm]) if mm else None
    ratio = None
    for copier, runs in s.runs.items():
        if not runs:
            continue
        wall = statistics.median([r.wall_s for r in runs])
        cpu = statistics.median([r.cpu_s for r in runs])
        wire = statistics.median([r.wire_to for r in runs])
        proxy_cpu = statistics.median([r.proxy_cpu_s for r in runs])
        rate = s.records / wall
        times = f"{rate / mm_rate:>7.2f}" if mm_rate else f"{'':>7}"
        if copier == "engine" and mm_rate:
            ratio = rate / mm_rate
        loads = "/".join(f"{r.load:.1f}" for r in runs)
        print(
            f"{copier:<18}{wall:>7.2f}{rate:>11,.0f}{times}{cpu:>7.2f}{cpu / s.records * 1e6:>11.1f}"
            f"{wire / 1e6:>11.1f}{wire / s.records:>7.0f}{proxy_cpu:>12.2f}  {loads}"
        )
    for copier, why in s.refused.items():
        print(f"{copier:<18}not run: {why}")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="100:1000000,1000:300000", help="VALUE_BYTES:RECORDS,...")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--delay-ms", type=float, default=25.0, help="added each way (the RTT grows by twice this)")
    parser.add_argument("--copiers", default=",".join(COPIERS), help=f"of {', '.join(COPIERS)}")
    parser.add_argument("--goal", type=float, default=3.0, help="the engine's throughput over MirrorMaker 1.0's")
    parser.add_argument("--max-wait-min", type=int, default=20, help="for the load average to drop to 3")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="for one copier run")
    args = parser.parse_args()
    # A SIGTERM unwinds like Ctrl-C, so the brokers, ZooKeeper and the proxy this started are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    copiers = args.copiers.split(",")
    unknown = set(copiers) - set(COPIERS)
    if unknown:
        parser.error(f"unknown copiers {sorted(unknown)}")
    sizes = [Sizes(int(v), int(n)) for v, n in (pair.split(":") for pair in args.sizes.split(","))]
    parts = args.partitions

    work = Path(tempfile.mkdtemp(prefix="mirus-wan-"))
    try:
        with clusters(work, args.delay_ms) as c, common.platform_database() as store:
            print(
                f"source {c.source}; destination {c.destination} through the proxy "
                f"({args.delay_ms:g} ms each way), {c.destination_direct} directly"
            )
            print(
                f"ApiVersions round trip: {round_trip_ms(c.destination):.1f} ms through the proxy, "
                f"{round_trip_ms(c.destination_direct):.1f} ms directly (median of 9)"
            )
            defaults = validate_submission(
                {
                    "name": "defaults",
                    "consumer.bootstrap.servers": c.source,
                    "destination.consumer.bootstrap.servers": c.destination,
                    "topics.whitelist": "x",
                }
            ).producer_settings(0)
            shown = ("batch.size", "linger.ms", "compression.type", "enable.idempotence", "acks")
            print("engine producer defaults: " + ", ".join(f"{k}={defaults.get(k)}" for k in shown))
            common.create_topic(c.destination_direct, "wan-probe", 1)
            for copier in copiers:
                codec = VARIANTS.get(copier, {}).get("producer.compression.type")
                if codec not in (None, "none") and (why := codec_refusal(c.proxy, "wan-probe", codec)):
                    for s in sizes:
                        s.refused[copier] = why
            env = {**os.environ, "MIRUS_DATABASE_URL": store.engine.url.render_as_string(hide_password=False)}
            cluster_pair = {"source": c.source, "destination": c.destination}
            counter = Consumer({"bootstrap.servers": c.destination_direct, "group.id": "wan-counter"})
            wait_for_quiet(LOAD_LIMIT, 60, args.max_wait_min * 60)
            deleted_at = 0.0
            for r in range(args.rounds):
                for s in sizes:
                    runnable = [x for x in copiers if x not in s.refused]
                    topic = f"wan-{s.value_bytes}-{int(time.time())}-{r}"
                    kit.preload(topic, s.records, parts, s.value_bytes, c.source, payloads(s.value_bytes))
                    # The brokers delete a deleted topic's files a minute later (Kafka's file.delete.delay.ms): not
                    # while a copier is measured.
                    time.sleep(max(0.0, deleted_at + FILE_DELETE_DELAY_S - time.monotonic()))
                    targets = []
                    # MirrorMaker and the engine back to back at the start of every round, taking turns to go
                    # first (the ratio the goal is about, under the same conditions); the variants after them, in
                    # an order that rotates by one every round.
                    pair = [x for x in ("mirrormaker", "engine") if x in runnable][:: 1 if r % 2 == 0 else -1]
                    rest = [x for x in runnable if x not in pair]
                    order = pair + rest[r % max(len(rest), 1) :] + rest[: r % max(len(rest), 1)]
                    for copier in order:
                        if copier == "mirrormaker":
                            target, stop = topic, signal.SIGTERM  # MirrorMaker 1.0 keeps the topic's name
                            argv = kit.mirrormaker_argv(topic, c.source, c.destination, c.home, work)[0]
                        else:
                            name, target, stop = f"{topic}-{copier}", f"{topic}.{copier}", signal.SIGINT
                            kit.put_engine_connector(
                                store, name, topic, f".{copier}", parts, 1, **VARIANTS[copier], **cluster_pair
                            )
                            argv = common.task_argv(name)
                        common.create_topic(c.destination_direct, target, parts)
                        targets.append(target)
                        log = work / f"{copier}.log"
                        # Every run starts with nothing left to write back to disk from the preload or the run
                        # before: that writeback costs CPU, which the engine (CPU-bound here) feels and MirrorMaker
                        # (bound by its one request in flight) hardly does.
                        os.sync()
                        run = timed_copy_over_link(
                            copier, argv, env, stop, log, counter, target, parts, s.records, c.proxy, args.timeout_s
                        )
                        s.runs.setdefault(copier, []).append(run)
                        print(
                            f"round {r + 1} {s.value_bytes:>5} B {copier:<17}{run.wall_s:7.2f} s wall "
                            f"{s.records / run.wall_s:>9,.0f} records/s {run.cpu_s:6.2f} CPU-s "
                            f"{run.wire_to / 1e6:7.1f} MB to dest (proxy {run.proxy_cpu_s:.2f} CPU-s) "
                            f"(load average {run.load:.2f})",
                            flush=True,
                        )
                    common.delete_topics(c.destination_direct, targets)
                    common.delete_topics(c.source, [topic])
                    deleted_at = time.monotonic()
            counter.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    ratios = {s.value_bytes: report(s, parts, args.delay_ms, args.rounds) for s in sizes}
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    measured = {size: ratio for size, ratio in ratios.items() if ratio is not None}
    if not measured:
        return
    verdict = all(ratio >= args.goal for ratio in measured.values())
    print(
        f"\nengine / MirrorMaker 1.0 throughput at {2 * args.delay_ms:g} ms RTT: "
        + ", ".join(f"{size:,} B {ratio:.2f}x" for size, ratio in measured.items())
        + f" (goal >= {args.goal:g}x: {'met' if verdict else 'NOT met'})"
    )
    if not verdict:
        sys.exit(1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["proxy"]:
        serve_proxy(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
    else:
        main()
