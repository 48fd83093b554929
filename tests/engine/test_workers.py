"""Workers: processes hosting the tasks of many connectors (MIRUS_REPLICATOR_WORKERS), on real brokers and Postgres."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import dagster as dg

from assets.connectors import _tasks
from mirus.waiting import wait_until
from mirus_dagster.constants import (
    CONNECTOR_PARTITIONS,
    TAG_REASON,
    TAG_WORKER,
    TAG_WORKERS,
    WATCHER_JOB,
    WORKER_JOB,
)
from mirus_dagster.jobs import build_watcher_job, replicator, replicator_worker
from mirus_dagster.settings import StackEndpoints
from replicator.engine.worker import TaskWorker, hosts
from replicator.state.records import LEASE_HELD, ConnectorState, ConnectorStatus, TaskStatus
from replicator.state.store import Store
from sensors.run_starter import build_run_starter
from sensors.supervisor import build_task_supervisor
from tests.fixtures.engine_helpers import connector_properties, create_connector
from tests.fixtures.kafka_helpers import create_topics, produce
from tests.fixtures.replica_check import check_replica


def test_every_task_is_hosted_by_distinct_workers_that_stay_put_as_the_estate_changes() -> None:
    tasks = [(f"connector-{c}", t) for c in range(100) for t in range(2)]
    placed = {task: hosts(*task, workers=10, copies=2) for task in tasks}
    assert all(len(set(w)) == 2 and all(0 <= i < 10 for i in w) for w in placed.values())
    # Spread over every worker, and each task's place depends on it alone: adding connectors moves nobody.
    assert {w for ws in placed.values() for w in ws} == set(range(10))
    assert {task: hosts(*task, workers=10, copies=2) for task in tasks[:50]} == {t: placed[t] for t in tasks[:50]}
    # More copies than workers: every worker hosts it, none twice; no copies asked still hosts it once.
    assert sorted(hosts("c", 0, workers=3, copies=5)) == [0, 1, 2]
    assert len(hosts("c", 0, workers=3, copies=0)) == 1


def _committed(store: Store, connector: str) -> int:
    return sum(store.load_offsets(connector).values())


def _owners(store: Store, connectors: list[str]) -> set[str]:
    return {lease.owner.rsplit(":", 1)[-1] for c in connectors if (lease := store.lease_of(c, 0)) is not None}


def test_two_worker_processes_host_several_connectors_and_a_kill_9_hands_every_task_to_the_other(
    stack: StackEndpoints, estate_db: tuple[Store, str], unique: str, tmp_path: Path
) -> None:
    store, url = estate_db
    workers_hand_over(stack, store, url, unique, tmp_path)


def workers_hand_over(stack: StackEndpoints, store: Store, url: str, unique: str, tmp_path: Path) -> None:
    """Two `mirus worker run` processes on `url` (the database of `store`, directly or through a pooler) host three
    connectors' tasks, each owned by its first-ranked worker; one is killed with SIGKILL and the other takes its
    tasks over, nothing lost."""
    names = [f"{unique}-{i}" for i in range(3)]
    for name in names:
        create_topics(stack.source_bootstrap_servers, {name: 2})
        create_topics(stack.destination_bootstrap_servers, {name: 2})
        properties = connector_properties(stack, name, **{"topics.whitelist": name, "task.standby.runs": "1"})
        create_connector(store, properties, {0: [(name, 0), (name, 1)]})

    def write(start: int) -> None:
        for name in names:
            produce(
                stack.source_bootstrap_servers,
                [
                    {"topic": name, "partition": i % 2, "key": b"%d" % i, "value": b"v%d" % i}
                    for i in range(start, start + 100)
                ],
            )

    write(0)
    env = {**os.environ, "MIRUS_DATABASE_URL": url}
    processes: list[subprocess.Popen[bytes]] = []

    def worker(index: int) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-c", "from mirus.cli.main import main; main()", "worker", "run", str(index)]
        with open(tmp_path / f"worker-{index}.log", "w") as log:
            processes.append(subprocess.Popen([*argv, "--workers", "2"], env=env, stdout=log, stderr=subprocess.STDOUT))
        return processes[-1]

    try:
        # Both workers host every task (each has a standby); a task nobody holds goes to its first-ranked worker.
        worker(0), worker(1)
        wait_until(lambda: all(_committed(store, n) == 100 for n in names), timeout=90, what="the workers replicating")
        preferred = {n: f"worker-{hosts(n, 0, workers=2, copies=2)[0]}" for n in names}
        assert {n: store.lease_of(n, 0).owner.rsplit(":", 1)[-1] for n in names} == preferred
        victim = preferred[names[0]]
        survivor = "worker-1" if victim == "worker-0" else "worker-0"
        standbys = sum(owner == victim for owner in preferred.values())
        log = tmp_path / f"{survivor}.log"
        wait_until(
            lambda: log.read_text().count("standing by: epoch 1 owns the task") == standbys,
            timeout=60,
            what=f"{survivor} standing by for the tasks {victim} owns",
        )
        killed = processes[int(victim[-1])]
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        write(100)
        wait_until(lambda: all(_committed(store, n) == 200 for n in names), timeout=60, what=f"{survivor} took over")
        assert _owners(store, names) == {survivor}
        assert {n: store.lease_of(n, 0).epoch for n in names} == {n: 2 if preferred[n] == victim else 1 for n in names}
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
                process.wait(30)
    for name in names:
        report = check_replica(
            stack.source_bootstrap_servers, name, stack.destination_bootstrap_servers, partitions=2, written=200
        )
        report.assert_at_least_once()


def test_a_worker_starts_a_new_connectors_task_when_postgres_tells_it_not_at_its_next_poll(
    stack: StackEndpoints, estate_db: tuple[Store, str], unique: str
) -> None:
    store, _ = estate_db
    names = [f"{unique}-first", f"{unique}-added"]
    for name in names:
        create_topics(stack.source_bootstrap_servers, {name: 1})
        create_topics(stack.destination_bootstrap_servers, {name: 1})
        produce(stack.source_bootstrap_servers, [{"topic": name, "key": b"k", "value": b"v%d" % i} for i in range(10)])
    first, added = (connector_properties(stack, name, **{"topics.whitelist": name}) for name in names)
    create_connector(store, first, {0: [(names[0], 0)]})
    # A poll far longer than the waits below: only the notice of the new assignment's commit can start its task.
    worker = TaskWorker(store, 0, 1, f"test:{unique}", poll_s=3600)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop.is_set,), name="test-worker")
    thread.start()
    try:
        wait_until(lambda: _committed(store, names[0]) == 10, timeout=60, what="the worker's first read hosting it")
        create_connector(store, added, {0: [(names[1], 0)]})
        wait_until(lambda: _committed(store, names[1]) == 10, timeout=60, what="the added connector replicating")
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive()


def test_with_workers_the_sensors_keep_that_many_worker_runs_and_no_run_per_task(
    resources: dict, instance: dg.DagsterInstance
) -> None:
    watcher = build_watcher_job(lambda connector, result: dg.AssetMaterialization(CONNECTOR_PARTITIONS))
    monitor = build_run_starter(
        replicator,
        watcher,
        connectors_event=lambda *args: dg.AssetMaterialization("connectors"),
        refresh_s=3600,
        worker_job=replicator_worker,
        workers=3,
    )
    supervisor = build_task_supervisor(replicator, replicator_worker, workers=3)

    def worker_requests(sensor: dg.SensorDefinition) -> list[dg.RunRequest]:
        result = sensor(dg.build_sensor_context(instance=instance, resources=resources))
        assert isinstance(result, dg.SensorResult), result
        assert all(r.job_name in (WORKER_JOB, WATCHER_JOB) for r in result.run_requests or ())
        return [r for r in result.run_requests or () if r.job_name == WORKER_JOB]

    started = worker_requests(monitor)
    assert sorted((r.tags[TAG_WORKER], r.tags[TAG_WORKERS]) for r in started) == [("0", "3"), ("1", "3"), ("2", "3")]
    runs = [instance.create_run_for_job(replicator_worker, run_config=r.run_config, tags=r.tags) for r in started]
    assert worker_requests(monitor) == [] and worker_requests(supervisor) == []  # all three are live

    instance.report_run_failed(runs[1])  # its process died: the monitor leaves it to the supervisor, which restarts it
    assert worker_requests(monitor) == []
    restarted = worker_requests(supervisor)
    assert [(r.tags[TAG_WORKER], r.tags[TAG_REASON]) for r in restarted] == [
        ("1", "restart: failed 1 time(s) in a row")
    ]


def test_the_connectors_view_links_the_worker_run_that_holds_a_task() -> None:
    run_id = str(uuid.uuid4())
    status = ConnectorStatus(
        name="orders",
        state=ConnectorState.RUNNING,
        version=1,
        assignment_generation=1,
        properties={},
        metadata_errors={},
        unhealthy_partitions={},
        tasks=[
            TaskStatus(0, 10, LEASE_HELD, None, 0, owner=f"node-1:4242:{run_id}"),
            TaskStatus(1, 10, LEASE_HELD, None, 0, owner="node-2:77"),  # `mirus task run`: no run
        ],
    )
    lines = _tasks(status, {})
    assert f"run [{run_id[:8]}](/runs/{run_id})" in lines[0] and "no run" in lines[1], lines
