"""connectors: a notice on channel mirus_connector_head whenever a running task's view of its connector changes

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27 13:00:00.000000

A task polls its connector's row (version, state, assignment generation, restart marker, pauses version) twice a
second; with this trigger Postgres also tells it, at the commit that changed the row (or deleted it), so that a new
topic's partitions or a pause reach the task at once (`replicator.state.head_notices`).
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION mirus_connector_head_notice() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('mirus_connector_head', COALESCE(NEW.name, OLD.name));
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER connectors_head_notice
        AFTER UPDATE OF version, state, assignment_generation, restart_requested_at, pauses_version OR DELETE
        ON connectors FOR EACH ROW EXECUTE FUNCTION mirus_connector_head_notice()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER connectors_head_notice ON connectors")
    op.execute("DROP FUNCTION mirus_connector_head_notice()")
