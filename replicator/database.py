"""Connections to the platform database and its migrations (Alembic, applied at start)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import OperationalError

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


class DatabaseUnavailableError(RuntimeError):
    """The platform database could not be reached or migrated; the message names it (password hidden)."""


def make_engine(url: str) -> Engine:
    """An engine for the platform database; `postgresql://` URLs use psycopg2."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg2://" + url.split("://", 1)[1]
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5)


def alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision`. Idempotent; concurrent callers serialize on an advisory lock."""
    command.upgrade(alembic_config(engine), revision)


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision(engine: Engine) -> str | None:
    return ScriptDirectory.from_config(alembic_config(engine)).get_current_head()


def migrated_engine(url: str) -> Engine:
    """An engine on a database brought to the newest schema: what every command that reads or writes needs."""
    engine = make_engine(url)
    try:
        upgrade(engine)
    except OperationalError as exc:
        engine.dispose()
        where = engine.url.render_as_string(hide_password=True)
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise DatabaseUnavailableError(f"the platform database at {where} is not reachable ({reason})") from None
    return engine
