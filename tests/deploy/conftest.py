"""Fixtures of the container tests (test_containers.py): a real Docker engine, and the compose deployment on the
host's network against the suite's own Apache Kafka clusters and Postgres.

The deployment gets databases of its own on the suite's Postgres server (its platform tables and Dagster's storage,
dropped at the end), so that its sensors see only its own connectors, and the other tests never see its leases.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from mirus.local.stack import free_port
from mirus_dagster.settings import StackEndpoints
from replicator.state.database import make_engine, upgrade
from replicator.state.store import Store
from tests.fixtures.compose_platform import (
    DOCKER_SOCKET,
    FIXED_VOLUMES,
    TEST_DAGSTER_DB,
    TEST_PROJECT,
    ComposePlatform,
    ensure_engine,
    git_commit,
    stop_engine,
    volume_exists,
)
from tests.fixtures.early_build import build_lock
from tests.fixtures.jvm import SHORT_LIVED_JVM_OPTIONS

log = logging.getLogger(__name__)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[None]:
    """The machine's Docker engine (started by the shared script if none answers; stopped again at the session's end
    if this session started it). An error, never a skip, when it cannot be had."""
    with build_lock():  # not while the early build starts it
        started = ensure_engine()
    yield
    if started:
        stop_engine()


def _admin(db_engine: Engine, statement: str) -> None:
    with db_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(statement))


@pytest.fixture(scope="module")
def compose_platform(
    docker_engine: None, apache_kafka: StackEndpoints, db_engine: Engine
) -> Iterator[tuple[ComposePlatform, Store]]:
    """The platform's services of docker-compose.yml, built and started as a user would (docker-compose 1.29, the
    host-network override), against the session's Apache Kafka clusters and Postgres; the deployment's store."""
    taken = [name for name in FIXED_VOLUMES if volume_exists(name)]
    assert not taken, (
        f"volumes {taken} exist: another mirus deployment runs on this engine, and this test's teardown would "
        "remove them; stop it (`docker compose down`) first"
    )
    suffix = uuid.uuid4().hex[:8]
    platform_db, dagster_db = f"mirus_ct_{suffix}", f"{TEST_DAGSTER_DB}{suffix}"
    server = db_engine.url
    for name in (platform_db, dagster_db):
        _admin(db_engine, f'CREATE DATABASE "{name}"')
    database_url = server.set(database=platform_db).render_as_string(hide_password=False)
    store = Store(make_engine(database_url))
    upgrade(store.engine)
    env = {
        "MIRUS_DATABASE_URL": database_url,
        "DAGSTER_POSTGRES_HOST": server.host or "127.0.0.1",
        "DAGSTER_POSTGRES_PORT": str(server.port or 5432),
        "DAGSTER_POSTGRES_USER": server.username or "",
        "DAGSTER_POSTGRES_PASSWORD": server.password or "",
        "DAGSTER_POSTGRES_DB": dagster_db,
        "MIRUS_SOURCE_BOOTSTRAP_SERVERS": apache_kafka.source_bootstrap_servers,
        "MIRUS_DESTINATION_BOOTSTRAP_SERVERS": apache_kafka.destination_bootstrap_servers,
        "MIRUS_UI_PORT": str(free_port()),
        "MIRUS_API_PORT": str(free_port()),
        "MIRUS_CODE_SERVER_PORT": str(free_port()),
        "MIRUS_DOCKER_GID": str(os.stat(DOCKER_SOCKET).st_gid),
        # A run (container) per task and per standby, the reports on demand only (no Spark run mid-test).
        "MIRUS_REPLICATOR_WORKERS": "0",
        "MIRUS_REPORT_SCHEDULE": "stopped",
        # The report run's Spark JVM: C1 alone and the serial collector took the report assets on a small lake,
        # on one core, from 123 to 66 s (11-30); the run must also prove that the setting reaches its container.
        "SPARK_SUBMIT_OPTS": SHORT_LIVED_JVM_OPTIONS,
        "MIRUS_COMMIT": git_commit(),
    }
    platform = ComposePlatform(f"{TEST_PROJECT}{suffix}", env, secrets=[server.password or ""])
    try:
        with build_lock():  # after the early build, whose layers this one finds
            log.info("images built in %.0f s", platform.build())
        log.info("platform up in %.0f s", platform.up())
        yield platform, store
    finally:
        try:
            leftovers = platform.down()
            assert not leftovers, f"left behind: {leftovers}"
        finally:
            platform.remove_images()
            store.engine.dispose()
            for name in (platform_db, dagster_db):
                _admin(db_engine, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
