"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-21 07:06:42.404007
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "connectors",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("assignment_generation", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("tasks_max", sa.Integer(), server_default="1", nullable=False),
        sa.Column("restart_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_connectors")),
    )
    op.create_table(
        "metadata_snapshots",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("connector", sa.Text(), nullable=True),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("topics", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("taken_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_metadata_snapshots")),
    )
    op.create_index(
        "ix_metadata_snapshots_connector_taken_at",
        "metadata_snapshots",
        ["connector", "taken_at"],
        unique=False,
    )
    op.create_table(
        "metric_samples",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("connector", sa.Text(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("interval_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("interval_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("records", sa.BigInteger(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("latency_min_ms", sa.BigInteger(), nullable=True),
        sa.Column("latency_max_ms", sa.BigInteger(), nullable=True),
        sa.Column("latency_sum_ms", sa.BigInteger(), nullable=False),
        sa.Column("latency_count", sa.BigInteger(), nullable=False),
        sa.Column("latency_histogram", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("lag", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_metric_samples")),
    )
    op.create_index(
        "ix_metric_samples_connector_interval_end",
        "metric_samples",
        ["connector", "interval_end"],
        unique=False,
    )
    op.create_table(
        "offsets",
        sa.Column("connector", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("connector", "topic", "partition", name=op.f("pk_offsets")),
    )
    op.create_table(
        "assignments",
        sa.Column("connector", sa.Text(), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("partitions", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["connector"],
            ["connectors.name"],
            name=op.f("fk_assignments_connector_connectors"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("connector", "generation", "task_id", name=op.f("pk_assignments")),
    )
    op.create_table(
        "connector_configs",
        sa.Column("connector", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("config", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["connector"],
            ["connectors.name"],
            name=op.f("fk_connector_configs_connector_connectors"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("connector", "version", name=op.f("pk_connector_configs")),
    )
    op.create_table(
        "partition_status",
        sa.Column("connector", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=True),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["connector"],
            ["connectors.name"],
            name=op.f("fk_partition_status_connector_connectors"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("connector", "topic", "partition", name=op.f("pk_partition_status")),
    )
    op.create_table(
        "task_leases",
        sa.Column("connector", sa.Text(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("owner", sa.Text(), nullable=True),
        sa.Column("state", sa.Text(), server_default="UNASSIGNED", nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("restart_attempts", sa.Integer(), server_default="0", nullable=False),
        sa.ForeignKeyConstraint(
            ["connector"],
            ["connectors.name"],
            name=op.f("fk_task_leases_connector_connectors"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("connector", "task_id", name=op.f("pk_task_leases")),
    )


def downgrade() -> None:
    op.drop_table("task_leases")
    op.drop_table("partition_status")
    op.drop_table("connector_configs")
    op.drop_table("assignments")
    op.drop_table("offsets")
    op.drop_index("ix_metric_samples_connector_interval_end", table_name="metric_samples")
    op.drop_table("metric_samples")
    op.drop_index("ix_metadata_snapshots_connector_taken_at", table_name="metadata_snapshots")
    op.drop_table("metadata_snapshots")
    op.drop_table("connectors")
