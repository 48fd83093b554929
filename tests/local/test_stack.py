"""The embedded stack itself: two separate clusters, a reachable Postgres, idempotent migrations, clean stops."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient
from sqlalchemy import Engine, create_engine, text

from mirus.cli.main import main
from mirus.local.stack import free_port, free_port_range
from mirus_dagster.settings import StackEndpoints
from replicator.state.database import SCHEMA_REVISION, current_revision, head_revision, upgrade
from replicator.state.schema import Base
from replicator.state.store import Store
from tests.fixtures.kafka_helpers import consume_all, create_topics, produce


def test_clusters_are_separate_and_carry_records(stack: StackEndpoints, unique: str) -> None:
    create_topics(stack.source_bootstrap_servers, {unique: 3})
    produce(
        stack.source_bootstrap_servers,
        [{"topic": unique, "partition": i % 3, "key": b"k%d" % i, "value": b"v%d" % i} for i in range(30)],
    )

    records = consume_all(stack.source_bootstrap_servers, unique, 3, expected=30)

    assert sorted(r.value for r in records) == sorted(b"v%d" % i for i in range(30))
    destination_topics = AdminClient({"bootstrap.servers": stack.destination_bootstrap_servers}).list_topics(timeout=10)
    assert unique not in destination_topics.topics


def test_postgres_is_reachable_and_migrations_are_idempotent(db_engine: Engine, unique: str) -> None:
    Store(db_engine).put_connector(unique, {"name": unique}, 1)  # what an upgrade of a live platform finds

    upgrade(db_engine)
    upgrade(db_engine)

    assert current_revision(db_engine) == head_revision(db_engine)
    with db_engine.connect() as conn:
        kept = conn.execute(text("SELECT name, tasks_max FROM connectors WHERE name = :n"), {"n": unique}).all()
        assert [tuple(row) for row in kept] == [(unique, 1)]
        # The migrations create exactly what the models describe.
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []


def _mirus(state_dir: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "MIRUS_STATE_DIR": str(state_dir), **env}
    for var in ("MIRUS_SOURCE_BOOTSTRAP_SERVERS", "MIRUS_DESTINATION_BOOTSTRAP_SERVERS", "MIRUS_DATABASE_URL"):
        full_env.pop(var, None)
    mirus = [sys.executable, "-c", "from mirus.cli.main import main; main()"]
    return subprocess.run([*mirus, *args], env=full_env, capture_output=True, text=True, timeout=180)


@pytest.fixture
def ports() -> dict[str, str]:
    return {
        "MIRUS_SOURCE_PORT": str(free_port()),
        "MIRUS_DESTINATION_PORT": str(free_port()),
        "MIRUS_POSTGRES_PORT": str(free_port()),
    }


def _pids(state_dir: Path, env: dict[str, str]) -> dict[str, int]:
    status = _mirus(state_dir, env, "stack", "status")
    assert status.returncode == 0, status.stderr
    pids = {}
    for line in status.stdout.splitlines():
        name, state, *rest = line.split()
        if state == "running":
            pids[name] = int(rest[-1].removeprefix("pid="))
    return pids


def test_free_ports_are_chosen_below_the_ephemeral_range_each_once() -> None:
    # A port of the ephemeral range may be taken as any outgoing connection's local port before its server binds it.
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    low, high = free_port_range()
    ports = [free_port() for _ in range(100)]
    assert len(set(ports)) == len(ports) and all(low <= p < high <= ephemeral for p in ports)
    for port in ports:  # bound as servers bind (SO_REUSEADDR)
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))


def test_stack_up_is_idempotent_and_down_stops_everything(tmp_path: Path, ports: dict[str, str]) -> None:
    first = _mirus(tmp_path, ports, "stack", "up")
    assert first.returncode == 0, first.stderr
    assert f"127.0.0.1:{ports['MIRUS_SOURCE_PORT']}" in first.stdout
    assert f"127.0.0.1:{ports['MIRUS_POSTGRES_PORT']}/mirus" in first.stdout
    pids = _pids(tmp_path, ports)
    assert set(pids) == {"source", "destination", "postgres"}
    postgres_children = [c.pid for c in psutil.Process(pids["postgres"]).children(recursive=True)]

    second = _mirus(tmp_path, ports, "stack", "up")
    assert second.returncode == 0, second.stderr
    assert _pids(tmp_path, ports) == pids

    # The stack comes up migrated: the next command finds the platform's tables, not a raw SQL error.
    task = _mirus(tmp_path, ports, "task", "run", "no-such-connector", "0")
    assert task.returncode == 1, task.stderr
    assert "connector 'no-such-connector' does not exist; add it with the put_connector job" in task.stderr
    assert "Traceback" not in task.stderr

    down = _mirus(tmp_path, ports, "stack", "down")
    assert down.returncode == 0, down.stderr
    for pid in [*pids.values(), *postgres_children]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert _pids(tmp_path, ports) == {}
    assert "nothing was running" in _mirus(tmp_path, ports, "stack", "down").stdout


def test_stack_up_fails_clearly_when_a_port_is_taken(tmp_path: Path, ports: dict[str, str]) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", int(ports["MIRUS_DESTINATION_PORT"])))
        squatter.listen()
        result = _mirus(tmp_path, ports, "stack", "up")
    try:
        assert result.returncode != 0
        assert f"port {ports['MIRUS_DESTINATION_PORT']} for destination is already in use" in result.stderr
    finally:
        _mirus(tmp_path, ports, "stack", "down")


def test_stack_up_shows_the_log_of_a_process_that_dies_at_start(tmp_path: Path, ports: dict[str, str]) -> None:
    # A broker binary that cannot start: the real failure mode of a broken install or a bad flag.
    broken = tmp_path / "broken-broker"
    broken.write_text("#!/bin/sh\necho 'fatal: storage engine unavailable' >&2\nexit 3\n")
    broken.chmod(0o755)

    result = _mirus(tmp_path, {**ports, "CALF_TANSU_BIN": str(broken)}, "stack", "up")

    assert result.returncode != 0
    assert "the source broker exited with code 3 while starting" in result.stderr
    assert "fatal: storage engine unavailable" in result.stderr


def test_every_database_command_migrates_a_fresh_database_or_says_what_to_run(
    stack: StackEndpoints, unique: str, tmp_path: Path
) -> None:
    """A database that never saw a migration is brought to the schema by `mirus db upgrade`; a task never migrates
    and says what to run; an unreachable one is named (without its password) with the command that starts the
    embedded one."""
    name = unique.replace("-", "_")
    admin = create_engine(stack.database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    fresh = stack.database_url.rsplit("/", 1)[0] + f"/{name}"
    runner = CliRunner()
    engine = create_engine(fresh)

    task = runner.invoke(main, ["task", "run", "no-such-connector", "0"], env={"MIRUS_DATABASE_URL": fresh})
    assert task.exit_code == 1, task.output
    assert "schema is at revision none" in task.output and "`mirus db upgrade`" in task.output, task.output
    assert current_revision(engine) is None

    upgraded = runner.invoke(main, ["db", "upgrade"], env={"MIRUS_DATABASE_URL": fresh})
    assert upgraded.exit_code == 0, upgraded.output
    assert current_revision(engine) == head_revision(engine) == SCHEMA_REVISION  # the revision tasks require
    task = runner.invoke(main, ["task", "run", "no-such-connector", "0"], env={"MIRUS_DATABASE_URL": fresh})
    assert task.exit_code == 1, task.output
    assert "connector 'no-such-connector' does not exist; add it with the put_connector job" in task.output
    engine.dispose()

    unreachable = f"postgresql://mirus:s3cret-pw@127.0.0.1:{free_port()}/mirus"
    for args in (["task", "run", "x", "0"], ["db", "upgrade"]):
        result = runner.invoke(main, args, env={"MIRUS_DATABASE_URL": unreachable, "MIRUS_STATE_DIR": str(tmp_path)})
        assert result.exit_code == 1, result.output
        assert "is not reachable" in result.output and "`mirus stack up`" in result.output, result.output
        assert "s3cret-pw" not in result.output
        assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
