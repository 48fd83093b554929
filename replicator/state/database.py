"""Connections to the platform database and its migrations (Alembic, applied at start)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import OperationalError

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# The newest migration's revision: what a task's process compares the database with, without importing Alembic (a
# tenth of a task's start). tests/local/test_stack.py checks it is Alembic's head.
SCHEMA_REVISION = "0014"


class DatabaseUnavailableError(RuntimeError):
    """The platform database could not be reached or migrated; the message names it (password hidden)."""


# A replicator task's process: one connection for its work (the loop and its background thread take turns) and one
# its owner keeps for the epoch lock (`replicator.engine.ownership`); no overflow, so 1,000 tasks hold 2,000 at most.
TASK_POOL = {"pool_size": 2, "max_overflow": 0}
# A worker's process (`replicator.engine.worker`): its tasks share the work connections (they commit in turns, a few
# milliseconds a second each), and every hosted task keeps one more for its epoch lock while it lives, so the
# overflow is not bounded; the pool itself keeps at most WORKER_POOL idle.
WORKER_POOL = {"pool_size": 3, "max_overflow": -1}


class SchemaBehindError(RuntimeError):
    """The platform database's schema is older than this code's: `mirus db upgrade` (or the platform's start)."""


def create_database(admin_url: str, name: str) -> None:
    """Create database `name` on the server of `admin_url` unless it exists (CREATE DATABASE runs outside a
    transaction)."""
    engine = create_engine(_psycopg2(admin_url), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            if conn.scalar(text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": name}) is None:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()


def _psycopg2(url: str) -> str:
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg2://" + url.split("://", 1)[1]
    return url


def make_engine(url: str, pool_size: int = 5, max_overflow: int = 5) -> Engine:
    """An engine for the platform database; `postgresql://` URLs use psycopg2."""
    return create_engine(_psycopg2(url), pool_pre_ping=True, pool_size=pool_size, max_overflow=max_overflow)


def alembic_config(engine: Engine) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision`. Idempotent; concurrent callers serialize on an advisory lock."""
    from alembic import command

    command.upgrade(alembic_config(engine), revision)


def upgrade_if_behind(engine: Engine) -> None:
    """Migrate only when the schema is behind this code's: a current one costs one read, no lock."""
    if current_revision(engine) != SCHEMA_REVISION:
        upgrade(engine)


def require_current(engine: Engine) -> None:
    """Fail clearly unless the schema is this code's (tasks never migrate: the platform's start does)."""
    current = current_revision(engine)
    if current != SCHEMA_REVISION:
        raise SchemaBehindError(
            f"the platform database's schema is at revision {current or 'none'}, this code needs "
            f"{SCHEMA_REVISION}: run `mirus db upgrade` (the platform's start and the code location apply it too)"
        )


def current_revision(engine: Engine) -> str | None:
    """The revision Alembic stored in the database (None before the first migration)."""
    with engine.connect() as conn:
        if not conn.scalar(text("SELECT to_regclass('alembic_version') IS NOT NULL")):
            return None
        revision: str | None = conn.scalar(text("SELECT version_num FROM alembic_version"))
        return revision


def head_revision(engine: Engine) -> str | None:
    """The newest revision of the migrations, as Alembic reads them."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config(engine)).get_current_head()


def migrated_engine(url: str) -> Engine:
    """An engine on a database brought to the newest schema: what every command that reads or writes needs."""
    return _checked_engine(make_engine(url), upgrade_if_behind)


def task_engine(url: str) -> Engine:
    """An engine for a replicator task's process: a pool of `TASK_POOL`, on a schema already migrated."""
    return _checked_engine(make_engine(url, **TASK_POOL), require_current)


def worker_engine(url: str) -> Engine:
    """An engine for a worker's process: a pool of `WORKER_POOL`, on a schema already migrated."""
    return _checked_engine(make_engine(url, **WORKER_POOL), require_current)


def _checked_engine(engine: Engine, check: Callable[[Engine], None]) -> Engine:
    """`engine` once `check` passed on it; disposed otherwise, an unreachable database named (password hidden)."""
    try:
        check(engine)
    except OperationalError as exc:
        engine.dispose()
        where = engine.url.render_as_string(hide_password=True)
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise DatabaseUnavailableError(f"the platform database at {where} is not reachable ({reason})") from None
    except SchemaBehindError:
        engine.dispose()
        raise
    return engine
