"""flows and checkpoints

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 06:40:00.000000
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "flows",
        sa.Column("connector", sa.Text(), nullable=False),
        sa.Column("source_cluster_id", sa.Text(), nullable=True),
        sa.Column("destination_cluster_id", sa.Text(), nullable=True),
        sa.Column("configs_synced_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("groups_synced_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_emitted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeats", postgresql.JSONB(astext_type=sa.Text()), server_default="[]", nullable=False),
        sa.Column("problems", postgresql.JSONB(astext_type=sa.Text()), server_default="{}", nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["connector"], ["connectors.name"], name=op.f("fk_flows_connector_connectors"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("connector", name=op.f("pk_flows")),
    )
    op.create_table(
        "checkpoints",
        sa.Column("connector", sa.Text(), nullable=False),
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("source_offset", sa.BigInteger(), nullable=False),
        sa.Column("destination_topic", sa.Text(), nullable=False),
        sa.Column("destination_partition", sa.Integer(), nullable=False),
        sa.Column("destination_offset", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("connector", "group_id", "topic", "partition", name=op.f("pk_checkpoints")),
    )


def downgrade() -> None:
    op.drop_table("checkpoints")
    op.drop_table("flows")
