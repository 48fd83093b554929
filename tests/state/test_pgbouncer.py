"""Through PgBouncer in transaction pooling mode (`tests/fixtures/pgbouncer.py`), on the real clusters: concurrent
upgrades migrate a new database, and a task replicates and commits while its standby waits, then the owner's process
is killed and the standby takes over at once, fences the old epoch and resumes from the last commit — the same
scenario as on a direct connection (`tests/engine/test_ownership.py`, `kill_9_hands_over`); and the same for two
workers (`tests/engine/test_workers.py`, `workers_hand_over`). Notices of a connector's change, which PgBouncer
does not carry, are not trusted through it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.state.database import head_revision, make_engine
from replicator.state.head_notices import PROBE_TIMEOUT_S, HeadNotices
from replicator.state.store import Store
from tests.engine.test_ownership import kill_9_hands_over
from tests.engine.test_workers import workers_hand_over
from tests.fixtures.engine_helpers import private_database
from tests.fixtures.pgbouncer import PgBouncer, start_pgbouncer


@pytest.fixture(scope="module")
def bouncer(stack: StackEndpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgBouncer]:
    bouncer = start_pgbouncer(stack.database_url, tmp_path_factory.mktemp("pgbouncer"))
    yield bouncer
    bouncer.stop()


def mirus(*argv: str, database_url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "from mirus.cli.main import main; main()", *argv],
        env={**os.environ, "MIRUS_DATABASE_URL": database_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def test_concurrent_upgrades_migrate_a_new_database_through_pgbouncer(
    db_engine: Engine, stack: StackEndpoints, bouncer: PgBouncer
) -> None:
    name = f"mirus_pgbouncer_{uuid.uuid4().hex[:8]}"
    with db_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as admin:
        admin.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            url = bouncer.url(stack.database_url, database=name)
            upgrades = [mirus("db", "upgrade", database_url=url) for _ in range(2)]
            outputs = [(upgrade.communicate(timeout=300)[0].decode(), upgrade.returncode) for upgrade in upgrades]
            expected = f"database at revision {head_revision(db_engine)}"
            assert all(code == 0 and expected in output for output, code in outputs), outputs
        finally:
            admin.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))


def test_a_task_through_pgbouncer_replicates_resumes_and_is_taken_over_when_its_process_dies(
    store: Store, stack: StackEndpoints, bouncer: PgBouncer, unique: str, tmp_path: Path
) -> None:
    kill_9_hands_over(store, stack, bouncer.url(stack.database_url), unique, tmp_path)


def test_workers_through_pgbouncer_host_tasks_and_hand_them_over_when_one_dies(
    stack: StackEndpoints, bouncer: PgBouncer, tmp_path: Path
) -> None:
    # A worker's standbys wait together (one statement asking which owners' locks are free) and hold no connection.
    engine = private_database(stack, f"workers_pgbouncer_{uuid.uuid4().hex[:8]}")
    try:
        url = bouncer.url(stack.database_url, database=engine.url.database)
        workers_hand_over(stack, Store(engine), url, f"pgbouncer-workers-{uuid.uuid4().hex[:8]}", tmp_path)
    finally:
        engine.dispose()


def test_notices_are_not_trusted_through_pgbouncer_where_they_never_arrive(
    db_engine: Engine, stack: StackEndpoints, bouncer: PgBouncer
) -> None:
    # PgBouncer in transaction mode takes LISTEN and delivers nothing: a task behind it must keep reading its
    # connector's row twice a second (`HeadNotices.heard`), while one on a direct connection may read it seldom.
    direct = HeadNotices(db_engine)
    bounced_engine = make_engine(bouncer.url(stack.database_url))
    through = HeadNotices(bounced_engine)
    try:
        wait_until(direct.heard, what="notices heard on a direct connection")
        wait_until(through.listening.is_set, what="LISTEN taken through PgBouncer")
        wait_until(lambda: through.unanswered_s() > PROBE_TIMEOUT_S, what="a probe through PgBouncer overdue")
        assert not through.heard() and direct.heard()
    finally:
        through.close()
        direct.close()
        bounced_engine.dispose()
