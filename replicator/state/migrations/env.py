"""Alembic environment: runs online against the engine handed over in `config.attributes`."""

from alembic import context
from sqlalchemy import text

from replicator.state.schema import Base

# Any process may start the platform and upgrade; the lock makes concurrent upgrades wait, not collide.
MIGRATION_LOCK_ID = 0x6D69727573  # "mirus"

engine = context.config.attributes["engine"]
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=Base.metadata, compare_type=True)
    with context.begin_transaction():
        # Transaction-scoped, so that upgrades also run through a transaction pooler (PgBouncer); taken before the
        # current revision is read, so a waiting upgrade finds what the one before it applied.
        connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": MIGRATION_LOCK_ID})
        context.run_migrations()
