"""partitions paused by an operator

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 07:00:00.000000

An operator pauses a single source partition, with a reason, until an operator resumes it (`partition_pauses`).
`connectors.pauses_version` rises with every such change, so a running task notices it in the connector row it
already polls and reads the pauses only then.
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("connectors", sa.Column("pauses_version", sa.BigInteger(), server_default="0", nullable=False))
    op.create_table(
        "partition_pauses",
        sa.Column("connector", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("paused_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["connector"],
            ["connectors.name"],
            name=op.f("fk_partition_pauses_connector_connectors"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("connector", "topic", "partition", name=op.f("pk_partition_pauses")),
    )


def downgrade() -> None:
    op.drop_table("partition_pauses")
    op.drop_column("connectors", "pauses_version")
