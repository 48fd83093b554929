"""Engine throughput and CPU against Apache MirrorMaker 1.0 and a tuned naive loop, on Apache Kafka.

    python benchmarks/vs_mirrormaker.py [--records 2000000] [--partitions 4] [--rounds 3] [--tasks 1,2,4]

Needs the two Apache Kafka 1.0 clusters running (see `benchmarks/apache_kafka.py`). Each round preloads a fresh
source topic, then every copier copies it into its own destination topic, one after the other, in an order
that rotates from round to round. Figures are medians over the rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median

import apache_kafka as kit
import common
from apache_kafka import DESTINATION, SOURCE, Run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--size", type=int, default=100, help="bytes per record")
    parser.add_argument(
        "--compression", default="none", help="the source topic's batches compressed so (lz4, gzip, snappy, zstd)"
    )
    parser.add_argument(
        "--source-batch-bytes",
        type=int,
        default=None,
        help="the source topic's producer batch.size (default: 64 KB for uncompressed 100 B records, written by "
        "Kafka's ProducerPerformance, 1 MB otherwise); set it to compare record sizes at the same batch size",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", default="1", help="engine runs with these tasks.max values, e.g. 1,2,4")
    parser.add_argument(
        "--copiers",
        default="mirrormaker,naive,engine",
        help="also: batches (the batch path's copier alone, replicator.batches), bare (a consume→produce loop on "
        "the engine's own client settings, headers and timestamps kept, nothing else: the floor of Python's "
        "per-record work), engine-batches (copy.mode=batches), engine-plain (provenance headers off), "
        "engine-compact (provenance.headers.compact), engine-eos (exactly.once.support=required), engine-baseline "
        "(the engine of --baseline)",
    )
    parser.add_argument(
        "--baseline",
        help="other checkouts of the project (commits to compare with, side by side), comma-separated: "
        "engine-baseline runs the engine from there (one copier per checkout, named after its folder, when several)",
    )
    parser.add_argument(
        "--until",
        choices=("destination", "committed"),
        default="destination",
        help="an engine run ends when the destination holds every record, or when Postgres holds "
        "every offset (engine-eos always: commit markers count in high watermarks)",
    )
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        help="this many processes spin on the CPU throughout, as other work on a shared machine would",
    )
    parser.add_argument(
        "--baseline-as",
        default="engine",
        choices=["engine", *kit.ENGINE_COPIERS],
        help="the engine copier whose connector properties the baselines run with (e.g. engine-batches)",
    )
    parser.add_argument(
        "--host",
        choices=("task", "worker"),
        default="task",
        help="where engine copiers run: `mirus task run` processes started in the timed window (task), or a `mirus "
        "worker run` process already running that a connector is added to (worker: the platform's default process "
        "shape; timed from the connector and its assignment written to Postgres, the worker's CPU from then until "
        "it has stopped; not for baselines)",
    )
    parser.add_argument("--logs", type=Path, help="keep each copier run's output in this folder")
    args = kit.parse_args(parser)
    if args.host == "worker" and "engine-baseline" in args.copiers.split(","):
        parser.error("--host worker: a baseline's connector is written by its own checkout, outside the timed window")
    logs = args.logs or Path(tempfile.mkdtemp(prefix="vs-mirrormaker-"))  # the worker says it started there
    logs.mkdir(parents=True, exist_ok=True)

    copiers = []
    for name in args.copiers.split(","):
        if name == "engine" or name in kit.ENGINE_COPIERS:
            copiers += [f"{name} x{t}" if t != "1" else name for t in args.tasks.split(",")]
        elif name == "engine-baseline" and args.baseline and "," in args.baseline:
            copiers += [f"engine-baseline:{Path(b).name}" for b in args.baseline.split(",")]
        else:
            copiers.append(name)
    checkouts = {Path(b).name: b for b in (args.baseline or "").split(",") if b}
    n, parts = args.records, args.partitions
    runs: dict[str, list[Run]] = {c: [] for c in copiers}
    with common.platform_database() as store, contextlib.ExitStack() as stack:
        for _ in range(args.busy):
            spinner = common.start_process([sys.executable, "-c", "while True: pass"], os.environ.copy())
            stack.callback(spinner.kill)
        # Each checkout's engine runs on a database of its own, at that checkout's schema.
        baseline_urls = {path: stack.enter_context(kit.baseline_database(n)) for n, path in checkouts.items()}
        env = {**os.environ, "MIRUS_DATABASE_URL": store.engine.url.render_as_string(hide_password=False)}
        for r in range(args.rounds):
            topic = f"copy-{int(time.time())}-{r}"
            batching = {} if args.source_batch_bytes is None else {"batch_bytes": args.source_batch_bytes}
            if args.compression == "none":
                kit.preload(topic, n, parts, args.size, **batching)
            else:  # JSON-like events, as compressible as a topic's events usually are
                values = kit.event_values(args.size)
                kit.preload(topic, n, parts, args.size, values=values, compression=args.compression, **batching)
            targets = []
            host: subprocess.Popen[bytes] | None = None
            begin: Callable[[], None] | None = None
            order = copiers[r % len(copiers) :] + copiers[: r % len(copiers)]
            for copier in order:
                if copier == "mirrormaker":
                    target, argvs, stop = topic, kit.mirrormaker_argv(topic), signal.SIGTERM
                elif copier in ("naive", "bare", "batches"):
                    target, stop = f"{topic}.{copier}", signal.SIGINT
                    argvs = kit.naive_argv(topic, target, n, parts, copier)
                else:
                    tasks = int(copier.partition("x")[2] or 1)
                    kind, _, checkout = copier.split()[0].removeprefix("engine-").partition(":")
                    kind = kind if "-" in copier else "engine"
                    checkout = checkouts.get(checkout) or args.baseline
                    label = kind + (f"-{Path(checkout).name}" if kind == "baseline" and len(checkouts) > 1 else "")
                    name, target = f"{topic}-{label}{tasks}", f"{topic}.{label}{tasks}"
                    extra = kit.ENGINE_COPIERS.get(f"engine-{kind}", {})
                    argvs, stop = kit.engine_argv(name, tasks), signal.SIGINT
                    suffix = target.removeprefix(topic)
                    if args.host == "worker":
                        argvs = []
                        begin = functools.partial(
                            kit.put_engine_connector, store, name, topic, suffix, parts, tasks, **extra
                        )
                        host = hosting_worker(env, logs / f"round{r + 1}-{copier.replace(' ', '')}-worker.log")
                        stack.callback(lambda w=host: w.poll() is None and w.kill())  # if the round fails first
                    elif kind == "baseline":
                        kit.put_baseline_connector(
                            checkout, baseline_urls[checkout], name, topic, suffix, parts, tasks,
                            **kit.ENGINE_COPIERS.get(args.baseline_as, {}),
                        )  # fmt: skip
                        argvs = kit.baseline_argvs(checkout, argvs, baseline_urls[checkout])
                    else:
                        kit.put_engine_connector(store, name, topic, suffix, parts, tasks, **extra)
                common.create_topic(DESTINATION, target, parts)
                targets.append(target)
                # Exactly-once: commit markers count in high watermarks; its copies are all there (visible to
                # read_committed readers) once Postgres holds every offset, which follows the transaction commit.
                by_commits = copier.startswith("engine") and (args.until == "committed" or "eos" in copier)
                committed = (lambda c=name: common.committed(store, c)) if by_commits else None
                log = logs / f"round{r + 1}-{copier.replace(' ', '')}.log"
                run = kit.timed_copy(
                    copier, argvs, target, parts, n, env, stop, copied=committed, log=log, host=host, begin=begin
                )
                if host is not None:  # gone from the database: the next worker must not host it too
                    store.delete_connector(name)
                host, begin = None, None
                runs[copier].append(run)
                print(
                    f"round {r + 1} {copier:<24} {run.wall_s:6.2f} s wall {run.cpu_s:6.2f} CPU-s "
                    f"{run.copy_rate:>12,.0f} records/s once copying (load average {run.load:.2f})",
                    flush=True,
                )
            common.delete_topics(DESTINATION, targets)
            common.delete_topics(SOURCE, [topic])

    print(f"\n{n:,} records x {args.size} B over {parts} partitions; median of {args.rounds} alternating runs")
    print("(copying: records/s from the first records seen at the destination to the last, the start left out)")
    print(
        f"{'copier':<24}{'wall s':>8}{'CPU-s':>8}{'records/s':>12}{'wall/MM1':>10}{'CPU/MM1':>9}"
        f"{'copying/s':>12}{'/MM1':>6}  load avg"
    )
    mm = runs.get("mirrormaker")
    mm_wall = median([x.wall_s for x in mm]) if mm else None
    mm_cpu = median([x.cpu_s for x in mm]) if mm else None
    mm_rate = median([x.copy_rate for x in mm]) if mm else None
    for copier, rs in runs.items():
        wall, cpu = median([x.wall_s for x in rs]), median([x.cpu_s for x in rs])
        rate = median([x.copy_rate for x in rs])
        ratios = f"{wall / mm_wall:>10.2f}{cpu / mm_cpu:>9.2f}" if mm_wall and mm_cpu else f"{'':>19}"
        rate_ratio = f"{rate / mm_rate:>6.2f}" if mm_rate else f"{'':>6}"
        loads = "/".join(f"{x.load:.1f}" for x in rs)
        print(f"{copier:<24}{wall:>8.2f}{cpu:>8.2f}{n / wall:>12,.0f}{ratios}{rate:>12,.0f}{rate_ratio}  {loads}")


def hosting_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`mirus worker run 0 --workers 1`, once it has started (its imports done) and hosts nothing yet."""
    worker = common.start_process([*common.MIRUS, "worker", "run", "0", "--workers", "1"], env, log=log)
    common.wait_until(lambda: log.exists() and " of 1 started" in log.read_text(), 60, 0.02, "the worker started")
    return worker


if __name__ == "__main__":
    main()
