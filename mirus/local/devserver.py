"""`dagster dev` on the platform's code location: its command line and DAGSTER_HOME (used by `mirus dev`), and a
driver that runs it as a real subprocess for end-to-end tests and benchmarks.

`dagster_dev(env)` picks a free port, writes `DAGSTER_HOME/dagster.yaml` (the platform's own instance settings),
starts `dagster_dev_command` in its own process group with its output in a log file, waits until the webserver
answers and the code location is loaded, and yields a `DagsterDev`: a `dagster_graphql.DagsterGraphQLClient`
plus helpers to list and wait for runs and to find a run's worker process. Leaving the `with` block shuts
everything down (SIGINT to the process group, SIGKILL only for what is still alive after the grace period) and
leaves no process behind.

How run workers look under `dagster dev` (Dagster 1.13, DefaultRunLauncher): the code server starts each run in
a `multiprocessing` "spawn" child, whose command line is the generic `multiprocessing.spawn` one and does not
name the run. The run id is found instead in the run's own event log: the engine event
"Started process for run (pid: N)" that the worker writes first. `run_worker` accepts a process whose command
line contains the run id as well (other launchers), and in both cases only a descendant of this `dagster dev`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from importlib.resources import files
from pathlib import Path
from typing import Any, TypeVar

import psutil
import requests
from dagster_graphql import DagsterGraphQLClient
from gql import Client, GraphQLRequest
from gql.transport.exceptions import TransportError
from gql.transport.requests import RequestsHTTPTransport

from mirus.local.devserver_processes import DevProcesses, KilledWorker, ShutdownReport
from mirus.local.devserver_queries import (
    LOGS_QUERY,
    RESET_SENSOR_MUTATION,
    RUNS_QUERY,
    STOP_SENSOR_MUTATION,
    TICKS_QUERY,
    WORKSPACE_QUERY,
    RunInfo,
)
from mirus.local.stack import free_port, log_tail
from mirus.waiting import wait_until
from mirus_dagster.constants import PUT_CONNECTOR_JOB, REPLICATOR_JOB

# What benchmarks and tests drive `dagster dev` with; the queries and the run's shape are `devserver_queries.py`'s,
# the processes `devserver_processes.py`'s.
__all__ = [
    "LOGS_QUERY",
    "RUNS_QUERY",
    "WORKSPACE_QUERY",
    "DagsterDev",
    "DagsterDevError",
    "KilledWorker",
    "RunInfo",
    "ShutdownReport",
    "dagster_dev",
    "dagster_dev_command",
    "launch_dagster_dev",
    "start_dagster_dev",
    "write_dagster_home",
]

CODE_LOCATION_MODULE = "mirus_dagster.definitions"
START_TIMEOUT_S = 180.0
SHUTDOWN_TIMEOUT_S = 60.0
LOG_TAIL_LINES = 60

T = TypeVar("T")

_STARTED_PROCESS = re.compile(r"Started process for run \(pid: (\d+)\)")


class DagsterDevError(RuntimeError):
    """`dagster dev` did not start, did not answer, or a wait on it timed out (the message has its log tail)."""


class DagsterDev:
    """A running `dagster dev`: its GraphQL client, run queries and waits, and its shutdown."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, home: Path, log: Path) -> None:
        self.process = process
        self.port = port
        self.home = home
        self.log = log
        self.url = f"http://127.0.0.1:{port}"
        self.client = DagsterGraphQLClient("127.0.0.1", port_number=port, timeout=60)
        self._gql = Client(transport=RequestsHTTPTransport(url=f"{self.url}/graphql", timeout=60))
        self.processes = DevProcesses(process)
        self.shutdown_report: ShutdownReport | None = None
        self._location: tuple[str, str] | None = None  # (code location, repository) once loaded

    # -- raw access ---------------------------------------------------------------------------------------

    def query(self, document: str, variables: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Run a GraphQL query or mutation against the webserver and return its data."""
        return self._gql.execute(GraphQLRequest(document, variable_values=dict(variables or {})))

    def fail(self, message: str) -> DagsterDevError:
        return DagsterDevError(f"{message}\n--- last lines of {self.log} ---\n{log_tail(self.log, LOG_TAIL_LINES)}")

    def until(self, condition: Callable[[], T | None], timeout: float, what: str, interval: float = 0.5) -> T:
        """Poll `condition` until it returns something truthy; on timeout, or if dagster dev exits, raise."""

        def met() -> T | None:
            result = condition()
            if not result and self.process.poll() is not None:
                raise self.fail(f"dagster dev exited with code {self.process.returncode} while waiting for {what}")
            return result

        try:
            return wait_until(met, timeout, interval, what)
        except TimeoutError:
            raise self.fail(f"timed out after {timeout:.0f}s waiting for {what}") from None

    # -- startup -----------------------------------------------------------------------------------------

    def _server_info(self) -> bool:
        try:
            return requests.get(f"{self.url}/server_info", timeout=2).ok
        except requests.RequestException:
            return False

    def _code_location_loaded(self) -> bool:
        try:
            data = self.query(WORKSPACE_QUERY)["workspaceOrError"]
        except (requests.RequestException, TransportError):
            return False  # the webserver is still starting
        if data["__typename"] != "Workspace":
            raise self.fail(f"workspace query failed: {data.get('message')}")
        for entry in data["locationEntries"]:
            location = entry["locationOrLoadError"]
            if location and location["__typename"] == "PythonError":
                raise self.fail(f"code location {entry['name']} failed to load: {location['message']}")
            if entry["loadStatus"] != "LOADED" or not location:
                return False
            jobs = {job["name"] for repo in location["repositories"] for job in repo["jobs"]}
            if REPLICATOR_JOB in jobs and PUT_CONNECTOR_JOB in jobs:
                self._location = (location["name"], location["repositories"][0]["name"])
                return True
        return False

    def wait_until_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        self.until(self._server_info, timeout, "the webserver to answer /server_info")
        self.until(self._code_location_loaded, max(deadline - time.monotonic(), 1.0), "the code location to load")
        self.processes.remember_descendants()

    # -- runs --------------------------------------------------------------------------------------------

    def runs(
        self,
        tags: Mapping[str, str] | None = None,
        job_name: str | None = None,
        statuses: Iterable[str] | None = None,
        limit: int = 500,
    ) -> list[RunInfo]:
        """Runs matching every given tag (and job, and status), newest first."""
        run_filter: dict[str, Any] = {}
        if tags:
            run_filter["tags"] = [{"key": k, "value": v} for k, v in tags.items()]
        if job_name:
            run_filter["pipelineName"] = job_name
        if statuses:
            run_filter["statuses"] = sorted(statuses)
        data = self.query(RUNS_QUERY, {"filter": run_filter, "limit": limit})["runsOrError"]
        if data["__typename"] != "Runs":
            raise self.fail(f"runs query failed: {data.get('message')}")
        self.processes.remember_descendants()
        return [RunInfo.of(r) for r in data["results"]]

    def run(self, run_id: str) -> RunInfo:
        found = self._runs_by_id(run_id)
        if not found:
            raise self.fail(f"run {run_id} not found")
        return found[0]

    def _runs_by_id(self, run_id: str) -> list[RunInfo]:
        data = self.query(RUNS_QUERY, {"filter": {"runIds": [run_id]}, "limit": 1})["runsOrError"]
        if data["__typename"] != "Runs":
            raise self.fail(f"runs query failed: {data.get('message')}")
        return [RunInfo.of(r) for r in data["results"]]

    def wait_for_runs(
        self,
        tags: Mapping[str, str] | None = None,
        *,
        statuses: Iterable[str] | None = None,
        count: int = 1,
        where: Callable[[RunInfo], bool] = lambda _run: True,
        job_name: str | None = None,
        timeout: float = 60.0,
        what: str = "",
    ) -> list[RunInfo]:
        """Wait until at least `count` runs match the tags, statuses and `where`; returns all that match."""
        wanted = set(statuses) if statuses is not None else None

        def matching() -> list[RunInfo] | None:
            found = [r for r in self.runs(tags, job_name) if (wanted is None or r.status in wanted) and where(r)]
            return found if len(found) >= count else None

        description = what or f"{count} run(s) with tags {dict(tags or {})} and status in {sorted(wanted or [])}"
        return self.until(matching, timeout, description)

    def wait_for_status(self, run_id: str, statuses: Iterable[str], timeout: float = 60.0) -> RunInfo:
        """Wait until run `run_id` has one of `statuses`; fails early if it finished with another."""
        wanted = set(statuses)

        def reached() -> RunInfo | None:
            found = self._runs_by_id(run_id)
            if not found:
                return None
            run = found[0]
            if run.status in wanted:
                return run
            if run.finished:
                raise self.fail(f"run {run_id} ended {run.status}, expected {sorted(wanted)}")
            return None

        return self.until(reached, timeout, f"run {run_id} to reach {sorted(wanted)}")

    def sensor_selector(self, sensor: str) -> dict[str, str]:
        if self._location is None:
            raise self.fail("the code location is not loaded")
        return {"repositoryLocationName": self._location[0], "repositoryName": self._location[1], "sensorName": sensor}

    def _sensor(self, sensor: str, after: float | None = None) -> dict[str, Any]:
        data = self.query(TICKS_QUERY, {"selector": self.sensor_selector(sensor), "after": after})["sensorOrError"]
        if data["__typename"] != "Sensor":
            raise self.fail(f"sensor {sensor}: {data.get('message')}")
        return data

    def sensor_ticks(self, sensor: str, after: float | None = None) -> list[tuple[float, str]]:
        """(timestamp, status) of the sensor's ticks, newest first, optionally only those after a Unix time."""
        return [(t["timestamp"], t["status"]) for t in self._sensor(sensor, after)["sensorState"]["ticks"]]

    def stop_sensors(self, sensors: Iterable[str], timeout: float = 30.0) -> list[str]:
        """Stop those of `sensors` that run and wait until none is mid-evaluation (its run requests are then
        visible as runs); returns the ones stopped."""
        stopped = []
        for sensor in sensors:
            data = self._sensor(sensor)
            if data["sensorState"]["status"] == "RUNNING":
                self.query(STOP_SENSOR_MUTATION, {"id": data["id"]})
                stopped.append(sensor)

        def idle() -> bool:
            return all(not (ticks := self.sensor_ticks(s)) or ticks[0][1] != "STARTED" for s in sensors)

        self.until(idle, timeout, f"sensors {sorted(sensors)} to finish their evaluation")
        return stopped

    def reset_sensors(self, sensors: Iterable[str]) -> None:
        """Back to the status their definitions declare (the platform's sensors: running)."""
        for sensor in sensors:
            self.query(RESET_SENSOR_MUTATION, {"selector": self.sensor_selector(sensor)})

    def run_messages(self, run_id: str) -> list[str]:
        """Every message of the run's event log, oldest first."""
        messages: list[str] = []
        cursor = None
        while True:
            data = self.query(LOGS_QUERY, {"runId": run_id, "afterCursor": cursor})["logsForRun"]
            if data["__typename"] != "EventConnection":
                raise self.fail(f"logs of run {run_id}: {data.get('message')}")
            messages += [e["message"] for e in data["events"] if e.get("message")]
            if not data["hasMore"] or data["cursor"] == cursor:
                return messages
            cursor = data["cursor"]

    # -- processes ---------------------------------------------------------------------------------------

    def descendants(self) -> list[psutil.Process]:
        return self.processes.descendants()

    def run_worker(self, run_id: str) -> psutil.Process | None:
        """The process executing run `run_id`, if it is alive and belongs to this `dagster dev`.

        First the pid the worker reported in the run's event log; else a process whose command line names the
        run, other than the compute-log tailers (`tail -F .../<run id>/compute_logs/...`, children of the worker).
        """
        descendants = {p.pid: p for p in self.descendants()}
        pids = [int(m.group(1)) for msg in self.run_messages(run_id) if (m := _STARTED_PROCESS.search(msg))]
        for pid in reversed(pids):
            if pid in descendants:
                return descendants[pid]
        for proc in descendants.values():
            try:
                cmdline = proc.cmdline()
            except psutil.Error:
                continue
            if any(run_id in arg and "compute_logs" not in arg for arg in cmdline):
                return proc
        return None

    def kill_run_worker(self, run_id: str, timeout: float = 60.0) -> KilledWorker:
        """SIGKILL run `run_id`'s process and its children (once it has one) and wait until they are gone."""
        worker = self.until(lambda: self.run_worker(run_id), timeout, f"the worker process of run {run_id}")
        killed, alive = self.processes.kill(worker)
        if alive:
            raise self.fail(f"still alive after SIGKILL: {alive}")
        return killed

    # -- shutdown ----------------------------------------------------------------------------------------

    def shutdown(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> ShutdownReport:
        """SIGINT the process group, wait, then SIGKILL whatever is left (`DevProcesses.shutdown`). Idempotent;
        raises if anything survives."""
        if self.shutdown_report is not None:
            return self.shutdown_report
        self.shutdown_report, leftovers = self.processes.shutdown(timeout)
        if leftovers:
            raise self.fail(f"processes left behind after SIGKILL: {leftovers}")
        return self.shutdown_report


def write_dagster_home(home: Path) -> Path:
    """DAGSTER_HOME with the platform's instance settings (mirus_dagster/dagster.yaml)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text(files("mirus_dagster").joinpath("dagster.yaml").read_text())
    return home


def dagster_dev_command(port: int, host: str | None = None) -> list[str]:
    """`dagster dev` (webserver + daemon) on the platform's code location."""
    argv = [sys.executable, "-m", "dagster", "dev", "-m", CODE_LOCATION_MODULE, "-p", str(port)]
    return argv + (["-h", host] if host else [])


def launch_dagster_dev(
    env: Mapping[str, str], home: Path, log: Path, port: int, workdir: Path | None = None
) -> DagsterDev:
    """Start `dagster dev` on 127.0.0.1:`port` with `env` added to this process's environment and its output
    appended to `log`, without waiting for it. It runs in a session of its own: a Ctrl-C in a terminal does not
    reach it, and one SIGINT to its process group reaches webserver, daemon and code server."""
    write_dagster_home(home)
    child_env = {**os.environ, **env, "DAGSTER_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(
            dagster_dev_command(port, "127.0.0.1"),
            env=child_env,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # SIGINT must work even when we were started with it ignored (a background shell): exec keeps SIG_IGN.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    return DagsterDev(process, port, home, log)


def start_dagster_dev(
    env: Mapping[str, str], workdir: Path | None = None, *, start_timeout: float = START_TIMEOUT_S
) -> DagsterDev:
    """Start `dagster dev` on the code location with `env` added to this process's environment; wait until ready.

    `workdir` holds DAGSTER_HOME and the log (a new temporary directory when omitted).
    """
    workdir = Path(workdir or tempfile.mkdtemp(prefix="dagster-dev-"))
    workdir.mkdir(parents=True, exist_ok=True)
    dev = launch_dagster_dev(env, workdir / "dagster-home", workdir / "dagster-dev.log", free_port(), workdir)
    try:
        dev.wait_until_ready(start_timeout)
    except BaseException:
        with suppress(DagsterDevError):  # the startup failure is the error to report
            dev.shutdown()
        raise
    return dev


@contextmanager
def dagster_dev(
    env: Mapping[str, str], workdir: Path | None = None, *, start_timeout: float = START_TIMEOUT_S
) -> Iterator[DagsterDev]:
    """`dagster dev` for the duration of the block; always shut down (and checked for leftovers) at its end."""
    dev = start_dagster_dev(env, workdir, start_timeout=start_timeout)
    try:
        yield dev
    finally:
        dev.shutdown()
