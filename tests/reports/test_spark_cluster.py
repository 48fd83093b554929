"""The report assets on a real Spark cluster: a standalone master and worker, and a Spark Connect server, started
on loopback from the `pyspark` distribution in the virtualenv. On the same Parquet lake, the assets run with
`MIRUS_SPARK_MASTER=spark://...` and with `sc://...` write exactly the tables they write in local mode, and their
checks come out exactly as in local mode.

A process holds one SparkSession and the suite's is local, so each cluster's report run is a subprocess
(`tests/fixtures/spark_driver.py`) with the settings a deployment gives the run: `MIRUS_SPARK_MASTER` and a
`spark-defaults.conf` in `SPARK_CONF_DIR`. Both run while the local reference is computed: the three share the
machine's cores instead of queueing for them."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pyspark
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.connect.utils import check_dependencies

from mirus.local.stack import free_port, log_tail
from mirus.waiting import wait_until
from mirus_dagster.reporting import spark_config
from replicator.engine.metrics import BUCKET_LABELS, TopicCounters
from reports.lake import BUCKET_COLUMNS, PART_FILE, SCHEMAS, hour_dir, hour_floor, state_path
from tests.fixtures.jvm import SHORT_LIVED_JVM_OPTIONS
from tests.fixtures.spark_driver import materialize_reports

ROOT = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).parent
START_TIMEOUT_S = 180.0  # JVMs starting side by side on a busy 2-core machine
DRIVER_TIMEOUT_S = 600.0

# -- the lake: six hours of an estate with every case the reports distinguish ---------------------------------

# (connector, task, source topic, destination topic, partitions the task reads)
WRITERS = (
    ("orders-dr", 0, "orders", "orders.dr", (0, 1)),
    ("orders-dr", 1, "orders", "orders.dr", (2, 3)),
    ("orders-dr", 1, "payments", "payments.dr", (0, 1)),
    ("logs-agg", 0, "logs", "agg.logs", (0, 1, 2)),
    ("metrics-mig", 0, "metrics", "metrics", (0, 1)),
)
LAKE_HOURS = 6
ROUTE_FIELDS = ("connector", "source_topic", "destination_topic", "cycle")
STATUS_FIELDS = ("connector", "topic", "partition", "state", "reason", "updated_at")


def _write(table: str, rows: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMAS[table]), path)


def _sample(rng: random.Random, end: datetime, records: int) -> dict[str, Any]:
    """Counters of `records` records acknowledged at `end`, with latencies from milliseconds to over 12 hours, folded
    by the task's own `TopicCounters`."""
    counters = TopicCounters()
    counters.add(records, records * rng.randint(40, 400))
    acknowledged_ms = int(end.timestamp() * 1000)
    counters.add_latencies(acknowledged_ms, [acknowledged_ms - int(rng.lognormvariate(8, 3)) for _ in range(records)])
    histogram = counters.cumulative_histogram()
    return {
        "records": counters.records,
        "bytes": counters.bytes,
        "latency_min_ms": counters.latency_min,
        "latency_max_ms": counters.latency_max,
        "latency_sum_ms": counters.latency_sum,
        "latency_count": counters.latency_count,
        # No usable high watermark now and then: the report's lag is then null.
        "lag": None if rng.random() < 0.05 else rng.randint(0, 50_000),
        **{column: histogram[label] for column, label in zip(BUCKET_COLUMNS, BUCKET_LABELS, strict=True)},
    }


def _metric_samples(lake: Path, first: datetime, last: datetime, rng: random.Random) -> None:
    """A sample per writer about every minute. The first hour is in the old layout (a row per partition); the
    newest hour is a full export plus an increment, as a refresh in the running hour leaves it."""
    by_hour: dict[datetime, list[dict[str, Any]]] = {}
    next_id = 1
    moment = first
    while moment <= last:
        for connector, task_id, topic, destination, partitions in WRITERS:
            if rng.random() < 0.1:  # an idle or restarting task writes nothing for a while
                continue
            end = moment + timedelta(seconds=rng.randint(0, 50), microseconds=rng.randint(0, 999_999))
            base = {"connector": connector, "task_id": task_id, "topic": topic, "destination_topic": destination}
            base |= {"interval_start": end - timedelta(seconds=60), "interval_end": end}
            per_partition = hour_floor(end) == hour_floor(first)
            for partition in partitions if per_partition else (None,):
                records = 0 if rng.random() < 0.08 else rng.randint(1, 120)
                row = {**base, "id": next_id, "partition": partition, **_sample(rng, end, records)}
                by_hour.setdefault(hour_floor(end), []).append(row)
                next_id += 1
        moment += timedelta(minutes=1)
    newest = max(by_hour)
    for hour, rows in by_hour.items():
        if hour == newest:
            half = len(rows) // 2
            _write("metric_samples", rows[:half], hour_dir(lake, "metric_samples", hour) / PART_FILE)
            increment = f"part-{rows[half]['id']}.parquet"
            _write("metric_samples", rows[half:], hour_dir(lake, "metric_samples", hour) / increment)
        else:
            _write("metric_samples", rows, hour_dir(lake, "metric_samples", hour) / PART_FILE)


def _snapshots_and_state(lake: Path, first: datetime) -> None:
    """Snapshot history and state in which partitions go missing, come back and go missing again, for each reason
    the report names; one partition paused and one dropped by a task."""
    at = {m: first + timedelta(minutes=m, seconds=7) for m in (10, 20, 30, 70, 95, 130, 190, 250, 280, 300)}
    orders_src = {"orders": 4, "payments": 2, "audit": 1, "unrelated": 3}
    grown_src = {**orders_src, "orders": 6}
    observations: list[tuple[datetime, str, str, dict[str, int], str | None]] = [
        (at[10], "orders-dr", "source", orders_src, None),
        (at[10], "orders-dr", "destination", {"orders.dr": 4, "payments.dr": 1}, None),
        (at[70], "orders-dr", "destination", {"orders.dr": 4, "payments.dr": 2}, None),  # payments fixed
        (at[130], "orders-dr", "destination", {"orders.dr": 4, "payments.dr": 1}, None),  # and missing again
        (at[190], "orders-dr", "source", grown_src, None),  # orders grew: partitions 4 and 5 have no destination
        (at[250], "orders-dr", "destination", {}, "destination cluster metadata unavailable"),
        (at[280], "orders-dr", "source", {**grown_src, "unrelated": 4}, None),
        (at[20], "logs-agg", "source", {"logs": 3}, None),
        (at[20], "logs-agg", "destination", {}, None),  # agg.logs missing until it is created
        (at[95], "logs-agg", "destination", {"agg.logs": 1}, None),  # fewer partitions, but no partition matching
        (at[30], "metrics-mig", "source", {"metrics": 2}, None),
        (at[30], "metrics-mig", "destination", {}, None),  # no destination checking: never missing
        (at[300], "deleted", "source", {"gone": 1}, None),  # a connector that no longer exists
        (at[300], "deleted", "destination", {}, None),
    ]
    by_hour: dict[datetime, list[dict[str, Any]]] = {}
    for snapshot_id, (taken_at, connector, cluster, topics, error) in enumerate(observations):
        base = {"snapshot_id": snapshot_id, "connector": connector, "cluster": cluster, "taken_at": taken_at}
        base["error"] = error
        rows = [{**base, "topic": t, "partitions": n} for t, n in topics.items()] or [{**base, "topic": None}]
        by_hour.setdefault(hour_floor(taken_at), []).extend(rows)
    for hour, rows in by_hour.items():
        _write("metadata_snapshots", rows, hour_dir(lake, "metadata_snapshots", hour) / PART_FILE)

    connector = {
        "state": "RUNNING",
        "version": 3,
        "tasks_max": 2,
        "source_cluster_alias": "src",
        "target_cluster_alias": "dst",
    }
    routes = [
        ("orders-dr", "orders", "orders.dr", False),
        ("orders-dr", "payments", "payments.dr", False),
        ("orders-dr", "audit", "audit.dr", False),
        ("orders-dr", "orders.dr", "orders.dr.dr", True),  # a cycle: never replicated, never missing
        ("logs-agg", "logs", "agg.logs", False),
        ("metrics-mig", "metrics", "metrics", False),
    ]
    status = [
        ("orders-dr", "orders", 1, "PAUSED", "paused by hand: reindexing the consumer", at[190]),
        ("orders-dr", "audit", 0, "PAUSED", "explained by the metadata already", at[95]),
        ("orders-dr", "heartbeats", 0, "DROPPED", "not a source topic", at[95]),
        ("orders-dr", "payments", 0, "RUNNING", None, at[95]),
        ("logs-agg", "logs", 2, "DROPPED", "a record of 2 MB exceeds the destination's max.message.bytes", at[250]),
    ]
    state = {
        "connectors": [
            {
                **connector,
                "connector": "orders-dr",
                "enable_destination_topic_checking": True,
                "enable_partition_matching": True,
            },
            {
                **connector,
                "connector": "logs-agg",
                "enable_destination_topic_checking": True,
                "enable_partition_matching": None,
            },
            {
                **connector,
                "connector": "metrics-mig",
                "enable_destination_topic_checking": False,
                "enable_partition_matching": False,
            },
        ],
        "connector_routes": [dict(zip(ROUTE_FIELDS, r, strict=True)) for r in routes],
        "partition_status": [dict(zip(STATUS_FIELDS, s, strict=True), task_id=0) for s in status],
        "assignments": [
            {"connector": c, "generation": 4, "task_id": t, "topic": topic, "partition": p}
            for c, t, topic, _, partitions in WRITERS
            for p in partitions
        ],
    }
    for table, rows in state.items():
        _write(table, rows, state_path(lake, table))


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six hours up to 15 minutes ago: inside the assets' 24-hour window, and every time step of it complete (the
    rates of a step still running depend on the time), so the tables the assets write do not depend on when they
    run."""
    path = tmp_path_factory.mktemp("lake")
    last = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=15)
    first = last - timedelta(hours=LAKE_HOURS)
    rng = random.Random(20261122)
    _metric_samples(path, first, last, rng)
    _snapshots_and_state(path, first)
    return path


# -- Spark processes ------------------------------------------------------------------------------------------


def _spark_distribution() -> None:
    """What the clusters start from: pyspark's pip distribution (its scripts, and the Spark Connect server's jar) and
    a Java runtime. A missing part is an error saying which."""
    scripts = [SPARK_HOME / "bin" / "spark-class", SPARK_HOME / "sbin" / "start-connect-server.sh"]
    missing = [str(p) for p in scripts if not p.exists()]
    if not any((SPARK_HOME / "jars").glob("spark-connect_*.jar")):
        missing.append(f"{SPARK_HOME / 'jars'}/spark-connect_*.jar (the Spark Connect server)")
    if not shutil.which("java") and not os.environ.get("JAVA_HOME"):
        missing.append("a Java runtime: java on PATH or JAVA_HOME (Spark 4 runs on Java 17 or 21)")
    if missing:
        raise RuntimeError(f"cannot start Spark from the pyspark distribution at {SPARK_HOME}; missing: {missing}")


def _spark_env(work: Path) -> dict[str, str]:
    """Environment of a cluster's processes and of the report run pointed at it; all they write goes under `work`
    (scratch space and temporary files included), nothing into the virtualenv or /tmp."""
    conf, scratch = work / "conf", work / "tmp"
    conf.mkdir(parents=True, exist_ok=True)
    scratch.mkdir(exist_ok=True)
    # These JVMs live a minute: C2-compiling Spark and a parallel collector would cost more CPU than they save, on a
    # 2-core machine running three report runs at once. Results do not depend on either.
    java_options = f"{SHORT_LIVED_JVM_OPTIONS} -Djava.io.tmpdir={scratch}"
    (conf / "spark-defaults.conf").write_text(
        # What the deployment puts in the report run's spark-defaults.conf: where executors reach the driver.
        "spark.driver.host 127.0.0.1\n"
        # The master's REST submission server takes fixed port 6066 otherwise; nothing here submits through it.
        "spark.master.rest.enabled false\n"
        # Drivers' web UIs would take port 4040 and up, which other runs on this machine may hold.
        "spark.ui.enabled false\n"
        f"spark.driver.extraJavaOptions {java_options}\n"
        f"spark.executor.extraJavaOptions {java_options}\n"
    )
    return {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_CONF_DIR": str(conf),
        "SPARK_LOCAL_IP": "127.0.0.1",  # the daemons and their web UIs bind to loopback only
        "SPARK_LOG_DIR": str(work / "logs"),
        "SPARK_PID_DIR": str(work),
        "SPARK_DAEMON_JAVA_OPTS": java_options,  # the master's and the worker's
    }


def _group(pgid: int) -> list[psutil.Process]:
    """The live (not zombie) processes of process group `pgid`."""
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return members


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group `process` leads (JVMs run their shutdown hooks: a worker kills its executors),
    SIGKILL to what is left of it after 30 s; returns once nothing of the group runs."""
    pgid = process.pid
    for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        try:
            wait_until(lambda: process.poll() is not None and not _group(pgid), grace, 0.1, f"process group {pgid}")
            break
        except TimeoutError:
            continue
    process.wait(5)
    left = [p.pid for p in _group(pgid)]
    assert not left, f"processes of group {pgid} still run after SIGKILL: {left}"


class SparkProcess:
    """A Spark process in a process group of its own (so that a stop reaches everything it started), its output in
    a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path, cwd: Path | None = None) -> None:
        self.name, self.log = name, log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def alive(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited with code {self.process.returncode}; last lines of {self.log}:\n"
                f"{log_tail(self.log, 60)}"
            )
        return True

    def stop(self) -> None:
        stop_group(self.process)


def _port_answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as answer:
            return int(json.load(answer)["aliveworkers"])
    except OSError:
        return 0


@dataclass
class SparkCluster:
    """A cluster's processes, started; `await_ready` waits for the condition that says it serves."""

    url: str  # what MIRUS_SPARK_MASTER is set to
    work: Path  # its spark-defaults.conf (conf/, SPARK_CONF_DIR) and logs
    env: dict[str, str]
    processes: list[SparkProcess]
    ready: Callable[[], bool]
    what: str  # the condition, for a timeout's message

    def await_ready(self) -> None:
        try:
            wait_until(lambda: all(p.alive() for p in self.processes) and self.ready(), START_TIMEOUT_S, 0.2)
        except TimeoutError:
            logs = "\n".join(f"{p.log}:\n{log_tail(p.log)}" for p in self.processes)
            raise RuntimeError(f"{self.url}: no {self.what} within {START_TIMEOUT_S:.0f} s\n{logs}") from None

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A standalone master and one worker (1 core, 1 GiB) on loopback, started side by side; ready once the master
    reports the worker alive."""
    _spark_distribution()
    work = tmp_path_factory.mktemp("spark-standalone")
    env, port, ui_port = _spark_env(work), free_port(), free_port()
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    master = [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port)]
    worker = [spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}", "--host", "127.0.0.1"]
    worker += ["--cores", "1", "--memory", "1g", "--webui-port", str(free_port()), "--work-dir", str(work / "worker")]
    processes = [
        SparkProcess("the Spark master", [*master, "--webui-port", str(ui_port)], env, work / "master.log"),
        SparkProcess("the Spark worker", worker, env, work / "worker.log"),
    ]
    cluster = SparkCluster(
        f"spark://127.0.0.1:{port}", work, env, processes, lambda: _alive_workers(ui_port) >= 1, "worker alive"
    )
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A Spark Connect server on loopback, running its queries in local mode: `start-connect-server.sh --wait` keeps
    it in the foreground, so that its process group is all of it. Ready once its gRPC port answers, which it opens
    after its own session is up."""
    _spark_distribution()
    try:
        check_dependencies()
    except ImportError as exc:
        raise RuntimeError(
            f"the Spark Connect client lacks a dependency: install the spark-connect extra (pip install -e '.[test]'); "
            f"{exc}"
        ) from exc
    work = tmp_path_factory.mktemp("spark-connect")
    port = free_port()
    argv = [str(SPARK_HOME / "sbin" / "start-connect-server.sh"), "--wait", "--master", "local[2]"]
    argv += ["--conf", "spark.connect.grpc.binding.address=127.0.0.1"]
    argv += ["--conf", f"spark.connect.grpc.binding.port={port}"]
    env = _spark_env(work)
    server = SparkProcess("the Spark Connect server", argv, env, work / "connect-server.log")
    cluster = SparkCluster(f"sc://127.0.0.1:{port}", work, env, [server], lambda: _port_answers(port), "gRPC port")
    try:
        yield cluster
    finally:
        cluster.stop()


# -- report runs ----------------------------------------------------------------------------------------------


class ReportRun:
    """`python -m tests.fixtures.spark_driver` against a cluster, on a copy of the lake of its own."""

    def __init__(self, cluster: SparkCluster, lake: Path) -> None:
        self.cluster = cluster
        self.lake, self.out = cluster.work / "lake", cluster.work / "reports.json"
        shutil.copytree(lake, self.lake)
        # The deployment's settings: the master, and spark-defaults.conf (SPARK_CONF_DIR, in the cluster's env).
        env = {**self.cluster.env, "MIRUS_SPARK_MASTER": cluster.url}
        argv = [sys.executable, "-m", "tests.fixtures.spark_driver", str(self.lake), str(self.out)]
        self.driver = SparkProcess(f"the report run on {cluster.url}", argv, env, cluster.work / "report-run.log", ROOT)

    def reports(self) -> dict[str, Any]:
        """What the run wrote, once it has ended."""
        process = self.driver.process
        try:
            process.wait(DRIVER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.driver.stop()
            raise AssertionError(
                f"the report run on {self.cluster.url} did not end within {DRIVER_TIMEOUT_S:.0f} s; "
                f"last lines of {self.driver.log}:\n{log_tail(self.driver.log, 60)}"
            ) from None
        assert process.returncode == 0, (
            f"the report run on {self.cluster.url} failed (exit code {process.returncode}); "
            f"last lines of {self.driver.log}:\n{log_tail(self.driver.log, 60)}"
        )
        return json.loads(self.out.read_text())


@pytest.fixture(scope="module")
def report_runs(
    standalone_cluster: SparkCluster, connect_server: SparkCluster, spark: SparkSession, lake: Path
) -> Iterator[dict[str, ReportRun]]:
    """A report run on each cluster, started as soon as that cluster serves; the tests collect their outcome. (The
    suite's local session, if not up yet, starts while the clusters do.)"""
    runs = {}
    try:
        for name, cluster in (("standalone", standalone_cluster), ("connect", connect_server)):
            cluster.await_ready()
            runs[name] = ReportRun(cluster, lake)
        yield runs
    finally:
        for run in runs.values():
            run.driver.stop()


@pytest.fixture(scope="module")
def local_reports(spark: SparkSession, lake: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The reference: the report assets in this process, on the suite's local session (`getOrCreate` returns it)."""
    copy = tmp_path_factory.mktemp("local-reports") / "lake"
    shutil.copytree(lake, copy)
    return materialize_reports(copy, spark_config("local[2]"))


@pytest.mark.parametrize("cluster", ["standalone", "connect"])
def test_report_assets_on_a_cluster_write_the_local_tables(
    cluster: str, report_runs: dict[str, ReportRun], local_reports: dict[str, Any]
) -> None:
    run = report_runs[cluster]
    reports = run.reports()
    for table, rows in local_reports["tables"].items():
        assert reports["tables"][table] == rows, f"{table} written on {run.cluster.url} differs from local mode"
    assert reports["checks"] == local_reports["checks"]


def test_the_lake_gives_every_report_rows_to_compare(lake: Path, local_reports: dict[str, Any]) -> None:
    """The comparison is worth what the lake holds: samples in both layouts, latencies in every bucket, every reason
    a partition is missing, lags missing now and then."""
    samples = pq.read_table(lake / "metric_samples").column("partition").to_pylist()
    assert None in samples and {0, 1, 2, 3} <= set(samples)
    tables = local_reports["tables"]
    latency = {r["destination_topic"]: r for r in tables["replication_latency"]}
    assert set(latency) == {"orders.dr", "payments.dr", "agg.logs", "metrics"}
    assert all(r["le_5m"] < r["le_10m"] < r["le_12h"] < r["count"] for r in latency.values())
    missing = {(r["connector"], r["source_topic"], r["partition"], r["reason"]) for r in tables["missing_partitions"]}
    assert missing == {
        ("orders-dr", "audit", 0, "destination topic missing"),
        ("orders-dr", "orders", 1, "paused by the task"),
        ("orders-dr", "orders", 4, "destination topic has fewer partitions"),
        ("orders-dr", "orders", 5, "destination topic has fewer partitions"),
        ("orders-dr", "payments", 1, "destination topic has fewer partitions"),
        ("logs-agg", "logs", 2, "dropped by the task"),
    }
    throughput = tables["throughput_lag"]
    assert {r["topic"] for r in throughput} == {"orders", "payments", "logs", "metrics"}
    assert len(throughput) > 4 * LAKE_HOURS * 10  # 5-minute steps
    assert any(r["lag"] is None for r in throughput) and any(r["lag"] for r in throughput)
    assert [c[1:3] for c in local_reports["checks"]] == [
        ["no_missing_partitions", False],
        ["p99_latency_within_threshold", False],
    ]
