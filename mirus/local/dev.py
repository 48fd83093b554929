"""`mirus dev`: the embedded stack, the demo and `dagster dev`, started quietly and stopped cleanly.

`dagster dev` runs in its own session with its output in `<state_dir>/logs/dagster.log`, so a Ctrl-C in the terminal
reaches `mirus dev` alone. Stopping then goes in the order that loses nothing: the platform's sensors are stopped
(so no replicator is started again), every live replicator run and the metadata watcher run are terminated through
Dagster (each task flushes, commits its offsets and releases its partitions; the run ends CANCELED), then
`dagster dev`, the demo traffic and the embedded stack are stopped. The sensors stopped this way are reset to their
defaults the next time `mirus dev` starts. The UI address is printed once the UI answers and the code location is
loaded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dagster_graphql import DagsterGraphQLClientError

from mirus.local.devserver import DagsterDev, DagsterDevError, RunInfo, launch_dagster_dev
from mirus.local.stack import LocalStack
from mirus_dagster.constants import (
    DEMO_CONNECTOR,
    DEMO_TOPIC,
    KIND_REPLICATOR,
    KIND_WATCHER,
    RUN_STARTER_SENSOR,
    SUPERVISOR_SENSOR,
    TAG_CONNECTOR,
    TAG_KIND,
    TAG_TASK,
    TAG_WORKER,
    WATCHER_JOB,
)
from mirus_dagster.settings import StackEndpoints

START_TIMEOUT_S = 180.0
RUN_STOP_TIMEOUT_S = 60.0
DAGSTER_STOP_TIMEOUT_S = 60.0
SLOW_RUN_STOP_S = 15.0  # a run still live this long after the stop began is named at once, not only at the timeout
LIVE_STATUSES = ("QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING")
TERMINABLE_STATUSES = ("QUEUED", "STARTED")  # those in which Dagster accepts a termination request


@dataclass
class DevSession:
    """One `mirus dev`: start() brings everything up, stop() takes it down in order and says what it stopped."""

    local: LocalStack
    port: int
    demo: bool
    keep_stack: bool
    echo: Callable[[str], None]
    api_port: int = 0  # the Kafka Connect REST API and /metrics; 0: not started
    dagster: DagsterDev | None = field(default=None, init=False)
    traffic: subprocess.Popen[bytes] | None = field(default=None, init=False)
    api: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.url = f"http://127.0.0.1:{self.port}"
        self.home = self.local.state_dir / "dagster-home"
        self.log = self.local.state_dir / "logs" / "dagster.log"
        self.stopped_sensors = self.home / "sensors-stopped-by-mirus-dev.json"

    # -- start -------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Stack, migrations, demo, `dagster dev`; returns once the UI answers with the code location loaded."""
        endpoints = self.local.up()
        self.echo(endpoints.describe())
        self._prepare_database(endpoints)
        if self.demo:
            self.traffic = _child(
                endpoints, "mirus.local.traffic", "--bootstrap-servers", endpoints.source_bootstrap_servers
            )
        if self.api_port:
            self.api = _child(endpoints, "mirus.cli.main", "api", "--port", str(self.api_port))
            self.echo(f"Kafka Connect REST API and /metrics: http://127.0.0.1:{self.api_port}")
        self.echo(f"starting Dagster (its log: {self.log}) ...")
        self.dagster = launch_dagster_dev(endpoints.as_env(), self.home, self.log, self.port)
        self.dagster.wait_until_ready(START_TIMEOUT_S)
        if self.stopped_sensors.exists():
            self.dagster.reset_sensors(json.loads(self.stopped_sensors.read_text()))
            self.stopped_sensors.unlink()

    def _prepare_database(self, endpoints: StackEndpoints) -> None:
        from mirus.local.demo import register_demo
        from replicator.state.database import migrated_engine
        from replicator.state.store import Store

        engine = migrated_engine(endpoints.database_url)
        try:
            if self.demo:
                register_demo(endpoints, Store(engine))
                self.echo(
                    f"demo: connector {DEMO_CONNECTOR} copies {DEMO_TOPIC} to {DEMO_TOPIC}.mirror; traffic is running"
                )
        finally:
            engine.dispose()

    def wait(self) -> int:
        """Until `dagster dev` exits by itself (it should not); its exit code, after saying so."""
        assert self.dagster is not None
        code = self.dagster.process.wait()
        self.echo(str(self.dagster.fail(f"dagster dev exited with code {code}")))
        return code

    # -- stop --------------------------------------------------------------------------------------------

    def stop(self) -> None:
        stopped: list[str] = []
        if self.dagster is not None and self.dagster.process.poll() is None:
            runs = self._stop_replicators()
            if runs:
                stopped.append(f"{len(runs)} replicator run(s) ({', '.join(runs)})")
            try:
                report = self.dagster.shutdown(DAGSTER_STOP_TIMEOUT_S)
                forced = f"; forced: {', '.join(report.killed)}" if report.killed else ""
                stopped.append(f"Dagster (webserver, daemon, code server{forced})")
            except DagsterDevError as exc:
                self.echo(f"warning: {exc}")
        for child, what in ((self.traffic, "demo traffic"), (self.api, "REST API")):
            if child is not None and child.poll() is None:
                os.killpg(child.pid, signal.SIGINT)  # the traffic generator flushes what it produced
                try:
                    child.wait(10)
                except subprocess.TimeoutExpired:
                    child.kill()
                stopped.append(what)
        if not self.keep_stack and (parts := self.local.down()):
            stopped.append(", ".join(parts))
        self.echo(f"stopped: {'; '.join(stopped)}" if stopped else "nothing was running")

    def _stop_replicators(self) -> list[str]:
        """Sensors off, then every live replicator run terminated and awaited: "<connector>-<task> <status>"."""
        assert self.dagster is not None
        dev = self.dagster
        try:
            dev.wait_until_ready(10)  # Ctrl-C may come while it starts
        except DagsterDevError:
            return []
        self.echo("stopping replicator runs (each flushes and commits its offsets) ...")
        if sensors := dev.stop_sensors((RUN_STARTER_SENSOR, SUPERVISOR_SENSOR)):
            self.stopped_sensors.write_text(json.dumps(sensors))
        live = dev.runs({TAG_KIND: KIND_REPLICATOR}, statuses=LIVE_STATUSES)  # task runs and worker runs
        # The metadata watcher run ends with them: nothing would be left reading the clusters of a stopped stack.
        if not live and not dev.runs({TAG_KIND: KIND_WATCHER}, job_name=WATCHER_JOB, statuses=LIVE_STATUSES):
            return []
        ids = {r.run_id for r in live}
        asked: set[str] = set()
        pending: list[RunInfo] = []
        started = time.monotonic()
        reported_slow = False

        def all_ended() -> bool:
            nonlocal pending, reported_slow
            pending = [
                r
                for kind in (KIND_REPLICATOR, KIND_WATCHER)
                for r in dev.runs({TAG_KIND: kind}, statuses=LIVE_STATUSES)
            ]
            ids.update(r.run_id for r in pending if r.tags.get(TAG_KIND) == KIND_REPLICATOR)
            for run_id in runs_to_terminate(pending):
                try:
                    dev.client.terminate_runs([run_id])
                    asked.add(run_id)
                except DagsterGraphQLClientError:
                    pass  # it changed status meanwhile (started, or ended): the next poll sees which
            if pending and not reported_slow and time.monotonic() - started > SLOW_RUN_STOP_S:
                reported_slow = True
                self.echo(f"still waiting for: {_describe_live(dev, pending, asked)}")
            return not pending

        try:
            dev.until(all_ended, RUN_STOP_TIMEOUT_S, "the replicator and watcher runs to end")
        except DagsterDevError as exc:
            # Said before `dagster dev` is stopped (and whatever survives it killed): which run did not end.
            self.echo(f"warning: {str(exc).splitlines()[0]}; still live: {_describe_live(dev, pending, asked)}")
        ended = [r for r in dev.runs({TAG_KIND: KIND_REPLICATOR}) if r.run_id in ids]
        return sorted(f"{_run_name(r)} {r.status}" for r in ended)


def runs_to_terminate(pending: Sequence[RunInfo]) -> list[str]:
    """The live runs to ask Dagster to terminate now: every one in a status it accepts the request in.

    Dagster refuses while a run is STARTING or CANCELING (a STARTING one is asked once it has STARTED). A run asked
    before is asked again whenever it shows QUEUED or STARTED, because the ask did not take: a run canceled in the
    queue at the moment the dequeuer launches it goes on to start (Dagster's QueuedRunCoordinator.cancel_run notes
    this race), and, asked once only, it would replicate until the stop's timeout. A request that takes moves the
    run on at once (CANCELED, or CANCELING), so no run is asked twice for nothing.
    """
    return sorted(r.run_id for r in pending if r.status in TERMINABLE_STATUSES)


def _describe_live(dev: DagsterDev, pending: Sequence[RunInfo], asked: set[str]) -> str:
    """Each live run: its task, status, id, whether it was asked to terminate, and its last event."""
    described = []
    for run in pending:
        try:
            messages = dev.run_messages(run.run_id)
        except DagsterDevError:
            messages = []
        last = f"; last event: {messages[-1][:200]}" if messages else ""
        described.append(
            f"{_run_name(run)} {run.status} (run {run.run_id}{'' if run.run_id in asked else ', not asked'}{last})"
        )
    return ", ".join(described)


def _run_name(run: RunInfo) -> str:
    if TAG_WORKER in run.tags:
        return f"worker {run.tags[TAG_WORKER]}"
    if run.tags.get(TAG_KIND) == KIND_REPLICATOR:
        return f"{run.tags.get(TAG_CONNECTOR)}-{run.tags.get(TAG_TASK)}"
    return f"{run.tags.get(TAG_KIND)} run"


def _child(endpoints: StackEndpoints, module: str, *args: str) -> subprocess.Popen[bytes]:
    """`python -m MODULE ARGS` on the stack, in its own session: stopped by us, in order, not by the Ctrl-C."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        env={**os.environ, **endpoints.as_env()},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
