"""Alembic environment: runs online against the engine handed over in `config.attributes`."""

from alembic import context
from sqlalchemy import text

from replicator.schema import Base

# Any process may start the platform and upgrade; the lock makes concurrent upgrades wait, not collide.
MIGRATION_LOCK_ID = 0x6D69727573  # "mirus"

engine = context.config.attributes["engine"]
with engine.connect() as connection:
    connection.execute(text("SELECT pg_advisory_lock(:id)"), {"id": MIGRATION_LOCK_ID})
    connection.commit()
    try:
        context.configure(connection=connection, target_metadata=Base.metadata, compare_type=True)
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()
    finally:
        connection.execute(text("SELECT pg_advisory_unlock(:id)"), {"id": MIGRATION_LOCK_ID})
        connection.commit()
