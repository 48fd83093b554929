"""A rolling upgrade from the previous release, with data it wrote itself: no connector loses an offset.

The previous release is the project's own last commit at the previous migration revision (`PREVIOUS_RELEASE`, whose
schema head is `PREVIOUS_REVISION`), taken from this repository's history with `git archive` and run as it was: its
`mirus db upgrade` creates its schema in an empty database, its `mirus connectors put` stores two connectors, its
monitor assigns their partitions and its `mirus task run` processes replicate real records and commit (offsets,
leases, metric samples and per-partition lags, as that release writes them). Then the upgrade as
docs/DEPLOYMENT.md ("Upgrading") gives it: this release's migrations are applied under the running tasks, which go on
replicating and committing; this release's task instances start beside them and stand by; the old processes are
stopped (SIGINT, as a pod's termination) and the new ones take over from the committed offsets. Every stored offset
and lag survives the migration, and every record written before, during and after reaches the destination.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.state.database import current_revision, head_revision, make_engine, upgrade
from replicator.state.store import Store
from tests.fixtures.engine_helpers import TaskThread, connector_properties
from tests.fixtures.kafka_helpers import create_topics, produce
from tests.fixtures.replica_check import check_replica

ROOT = Path(__file__).resolve().parents[2]
# The commit before the one that added migration 0007: the release whose schema head is 0006.
PREVIOUS_RELEASE = "9f11f419133d904e958f10a71204818affe6a0f1^"
PREVIOUS_REVISION = "0006"
BEFORE, DURING, AFTER = 40, 20, 30  # records per partition: before the upgrade, between its steps, after it


def records(topic: str, partitions: int, count: int, phase: str) -> list[dict]:
    """`count` records in each partition of `topic`."""
    return [
        {"topic": topic, "partition": i % partitions, "value": f"{phase}-{i}".encode()}
        for i in range(count * partitions)
    ]


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's source tree, from this repository's history."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", PREVIOUS_RELEASE], capture_output=True, check=False
    )
    assert archive.returncode == 0, (
        f"the previous release ({PREVIOUS_RELEASE}) is not in this clone's history (a shallow clone?): "
        f"{archive.stderr.decode(errors='replace')}"
    )
    tree = tmp_path_factory.mktemp("previous-release")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tree, filter="data")
    return tree


def empty_database(stack: StackEndpoints, name: str) -> str:
    """A new database on the stack's Postgres, without any schema; its URL."""
    admin = make_engine(stack.database_url).execution_options(isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return stack.database_url.rsplit("/", 1)[0] + f"/{name}"


class PreviousRelease:
    """The previous release's `mirus` command and modules, run from its own tree in the same Python environment."""

    def __init__(self, tree: Path, database_url: str) -> None:
        # Its own packages first (the tree is the working directory, so `sys.path[0]`), none of this release's.
        self.tree, self.env = tree, {**os.environ, "PYTHONPATH": str(tree), "MIRUS_DATABASE_URL": database_url}

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-c", "import sys; from mirus_dagster.cli import main; main()", *args]

    def mirus(self, *args: str, stdin: str = "") -> str:
        result = subprocess.run(
            self.argv(*args), cwd=self.tree, env=self.env, input=stdin, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, f"previous release: mirus {' '.join(args)}: {result.stdout}{result.stderr}"
        return result.stdout

    def python(self, code: str) -> str:
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=self.tree, env=self.env, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, f"previous release: {result.stdout}{result.stderr}"
        return result.stdout

    def task(self, connector: str, task_id: int) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv("task", "run", connector, str(task_id)),
            cwd=self.tree,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )


@pytest.fixture
def upgraded_database(stack: StackEndpoints) -> Iterator[str]:
    name = f"upgrade_{uuid.uuid4().hex[:8]}"
    yield empty_database(stack, name)
    admin = make_engine(stack.database_url).execution_options(isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def test_a_rolling_upgrade_from_the_previous_release_resumes_every_connector_with_no_offset_lost(
    stack: StackEndpoints, previous_release: Path, upgraded_database: str
) -> None:
    old = PreviousRelease(previous_release, upgraded_database)
    assert f"database at revision {PREVIOUS_REVISION}" in old.mirus("db", "upgrade")
    unique = uuid.uuid4().hex[:8]
    connectors = {f"orders-{unique}": (f"orders-{unique}", 3, 2), f"payments-{unique}": (f"payments-{unique}", 2, 1)}
    for name, (topic, partitions, tasks) in connectors.items():
        create_topics(stack.source_bootstrap_servers, {topic: partitions})
        create_topics(stack.destination_bootstrap_servers, {f"{topic}.mirror": partitions})
        properties = connector_properties(
            stack,
            name,
            **{
                "topics.whitelist": topic,
                "destination.topic.name.suffix": ".mirror",
                "tasks.max": str(tasks),
                "emit.heartbeats.enabled": "false",
            },
        )
        old.mirus("connectors", "put", name, stdin=json.dumps(properties))
        produce(stack.source_bootstrap_servers, records(topic, partitions, BEFORE, "before"))
    # Its monitor assigns the partitions (retrying until both clusters' metadata was read).
    old.python(
        "import sys, time\n"
        "from replicator.database import make_engine\n"
        "from replicator.monitor import KafkaMonitor\n"
        "from replicator.store import Store\n"
        f"store = Store(make_engine({upgraded_database!r}))\n"
        "monitor = KafkaMonitor(store)\n"
        f"for name, tasks in {[(n, t) for n, (_, _, t) in connectors.items()]!r}:\n"
        "    deadline = time.monotonic() + 60\n"
        "    while len(store.read_assignment(name)) < tasks and time.monotonic() < deadline:\n"
        "        monitor.poll(name)\n"
        "        time.sleep(0.5)\n"
        "    assert len(store.read_assignment(name)) == tasks, (name, store.read_assignment(name))\n"
    )
    engine = make_engine(upgraded_database)
    store = Store(engine)  # this release reads the offsets table, which the migration leaves as it is
    expected = {
        name: {(topic, p): BEFORE for p in range(partitions)} for name, (topic, partitions, _) in connectors.items()
    }

    def committed_up_to(count: int) -> bool:
        return all(store.load_offsets(name) == {tp: count for tp in offsets} for name, offsets in expected.items())

    runs = [old.task(name, t) for name, (_, _, tasks) in connectors.items() for t in range(tasks)]
    new_tasks: list[TaskThread] = []
    try:
        wait_until(lambda: committed_up_to(BEFORE), timeout=120, what="the previous release's tasks to commit")
        assert current_revision(engine) == PREVIOUS_REVISION
        measured = {(c, t, p) for c, (t, n, _) in connectors.items() for p in range(n)}

        def stored_lags() -> dict[tuple[str, str, int], int | None] | None:
            """The lags as that release stores them, a row per partition, once its tasks measured each one."""
            with engine.connect() as conn:
                rows = conn.execute(text("SELECT connector, topic, partition, lag FROM partition_lags"))
                lags = {(r.connector, r.topic, r.partition): r.lag for r in rows}
            return lags if measured <= set(lags) and all(lags[tp] == 0 for tp in measured) else None

        lags = wait_until(stored_lags, timeout=60, what="the previous release's tasks to record every partition's lag")

        # 1. Migrations first, under the running tasks of the previous release: they keep replicating and committing.
        upgrade(engine)
        assert current_revision(engine) == head_revision(engine)
        assert {name: store.load_offsets(name) for name in connectors} == expected
        assert {(c, t, p): lag for c in connectors for (t, p), lag in store.partition_lags(c).items()} == lags
        for topic, partitions, _ in connectors.values():
            produce(stack.source_bootstrap_servers, records(topic, partitions, DURING, "during"))
        wait_until(
            lambda: committed_up_to(BEFORE + DURING), timeout=120, what="the previous release's tasks on the new schema"
        )
        # 2. This release's task instances beside them, standing by as warm standbys do.
        new_tasks = [
            TaskThread.start(store, name, t, owner="new-release", owned=True)
            for name, (_, _, n) in connectors.items()
            for t in range(n)
        ]
        wait_until(
            lambda: all(any(e.startswith("standing by: epoch") for e in task.events) for task in new_tasks),
            timeout=60,
            what="this release's tasks standing by beside the previous release's",
        )
    finally:
        # 3. The previous release's processes stopped (each commits as it stops): this release's take over.
        for run in runs:
            run.send_signal(signal.SIGINT)
        outputs = [run.communicate(timeout=60)[0] for run in runs]
    try:
        assert all(run.returncode == 0 for run in runs), outputs
        for topic, partitions, _ in connectors.values():
            produce(stack.source_bootstrap_servers, records(topic, partitions, AFTER, "after"))
        wait_until(
            lambda: committed_up_to(BEFORE + DURING + AFTER),
            timeout=120,
            what="this release's tasks to take over every connector and commit what was written after",
        )
        for name, (_, _, n) in connectors.items():
            for t in range(n):
                lease = store.lease_of(name, t)
                assert lease is not None and lease.owner == "new-release", (name, t, lease)
    finally:
        for task in new_tasks:
            task.finish()
    for topic, partitions, _ in connectors.values():
        check_replica(
            stack.source_bootstrap_servers,
            topic,
            stack.destination_bootstrap_servers,
            f"{topic}.mirror",
            partitions=partitions,
            written=(BEFORE + DURING + AFTER) * partitions,
        ).assert_at_least_once()
    engine.dispose()
