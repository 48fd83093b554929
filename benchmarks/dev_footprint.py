"""What `mirus dev` with its demo costs on this machine: resident memory of everything it started, and its runs.

    python benchmarks/dev_footprint.py [--rounds 2] [--shapes runs,default]

Per round and shape (alternating), `mirus dev` starts in a fresh directory on free ports, exactly as the README
runs it otherwise (the demo connector `orders-mirror`, tasks.max 2, one standby a task; its traffic generator):
- `runs`: MIRUS_REPLICATOR_WORKERS=0, a Dagster run per task and per standby (the default until workers were);
- `default`: MIRUS_REPLICATOR_WORKERS unset, the platform's default shape.
Once every demo partition has committed offsets and the set of processes has not changed for 15 s, it prints the
run processes (the code server's children) and the resident memory (RSS, and PSS, which counts shared pages once) of
all processes `mirus dev` started, split into runs and the rest (Dagster's webserver, daemon and code server, the
API, the traffic generator, both brokers, Postgres); then it stops `mirus dev` with a SIGINT.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import common
import psutil

from mirus.waiting import wait_until
from mirus_dagster.constants import DEMO_CONNECTOR, DEMO_PARTITIONS, DEMO_TOPIC
from replicator.state.database import make_engine
from replicator.state.store import Store

STABLE_S = 15.0


@dataclass
class Footprint:
    shape: str
    runs: int
    run_rss_mb: float
    rest_rss_mb: float
    rss_mb: float
    pss_mb: float


def is_run(proc: psutil.Process) -> bool:
    """A Dagster run's process: the code server starts each as a multiprocessing child (`spawn_main`)."""
    try:
        line = " ".join(proc.cmdline())
    except psutil.Error:
        return False
    return "execute_run" in line or ("spawn_main" in line and "resource_tracker" not in line)


def measure(shape: str) -> Footprint:
    with tempfile.TemporaryDirectory(prefix="mirus-dev-footprint-") as work:
        ports = {name: common.free_port() for name in ("source", "destination", "postgres", "ui", "api")}
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MIRUS_", "DAGSTER_"))}
        env |= {
            "PYTHONPATH": str(common.ROOT),  # this checkout's code in every process `mirus dev` starts
            "MIRUS_SOURCE_PORT": str(ports["source"]),
            "MIRUS_DESTINATION_PORT": str(ports["destination"]),
            "MIRUS_POSTGRES_PORT": str(ports["postgres"]),
        }
        if shape == "runs":
            env["MIRUS_REPLICATOR_WORKERS"] = "0"
        argv = [*common.MIRUS, "dev", "--port", str(ports["ui"]), "--api-port", str(ports["api"])]
        console = Path(work) / "console.log"
        dev = common.start_process(argv, env, log=console, cwd=work)
        try:
            wait_until(lambda: "Dagster UI:" in console.read_text(), 300, 1, what="the UI")
            store = Store(make_engine(f"postgresql+psycopg2://postgres@127.0.0.1:{ports['postgres']}/mirus"))
            demo = [(DEMO_TOPIC, p) for p in range(DEMO_PARTITIONS)]
            wait_until(
                lambda: all(store.load_offsets(DEMO_CONNECTOR).get(tp) for tp in demo),
                300,
                1,
                what="every demo partition committed",
            )
            store.engine.dispose()
            root = psutil.Process(dev.pid)
            seen, since = {p.pid for p in common.tree(root)}, time.monotonic()
            while time.monotonic() - since < STABLE_S:
                time.sleep(1)
                now = {p.pid for p in common.tree(root)}
                if now != seen:
                    seen, since = now, time.monotonic()
            procs = common.tree(root)
            runs = [p for p in procs if is_run(p)]
            for p in procs:
                print(f"    {common.rss_mib([p]):6.0f} MiB {' '.join(p.cmdline())[:140]}", flush=True)
            (rss, pss), run_rss = common.memory_mib(procs), common.rss_mib(runs)
            return Footprint(shape, len(runs), run_rss, rss - run_rss, rss, pss)
        finally:
            os.killpg(dev.pid, signal.SIGINT)
            try:
                dev.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(dev.pid, signal.SIGKILL)
                dev.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shapes", default="runs,default")
    args = parser.parse_args()
    results: dict[str, list[Footprint]] = {}
    for round_ in range(args.rounds):
        for shape in args.shapes.split(","):
            figures = measure(shape)
            results.setdefault(shape, []).append(figures)
            print(
                f"round {round_ + 1} {shape}: {figures.runs} run processes ({figures.run_rss_mb:.0f} MiB), "
                f"the rest {figures.rest_rss_mb:.0f} MiB; RSS {figures.rss_mb:.0f} MiB, PSS {figures.pss_mb:.0f} MiB",
                flush=True,
            )
    print(f"machine: {os.cpu_count()} cores; medians of {args.rounds} round(s):")
    for shape, rounds in results.items():
        runs, run_rss = median(f.runs for f in rounds), median(f.run_rss_mb for f in rounds)
        rest, rss, pss = (median(getattr(f, a) for f in rounds) for a in ("rest_rss_mb", "rss_mb", "pss_mb"))
        print(
            f"  {shape:<8} runs {runs:.0f} ({run_rss:.0f} MiB), rest {rest:.0f} MiB, RSS {rss:.0f}, PSS {pss:.0f} MiB"
        )


if __name__ == "__main__":
    main()
