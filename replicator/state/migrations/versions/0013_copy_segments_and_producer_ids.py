"""copy_segments and platform_producer_ids: the provenance of copies made as record batches

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 09:00:00.000000

Shallow mirroring (issue 48) copies record batches as bytes, without provenance headers. Where their copies are
(`copy_segments`, written with the offsets they are committed with) gives exact translation and verification; the
producer ids this platform's flows hold at each cluster (`platform_producer_ids`) are the batch path's cycle guard.
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "copy_segments",
        sa.Column("connector", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("destination_topic", sa.Text(), nullable=False),
        sa.Column("destination_partition", sa.Integer(), nullable=False),
        sa.Column("destination_start", sa.BigInteger(), nullable=False),
        sa.Column("source_start", sa.BigInteger(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "connector",
            "topic",
            "partition",
            "destination_topic",
            "destination_partition",
            "destination_start",
            name=op.f("pk_copy_segments"),
        ),
    )
    op.create_index(
        "ix_copy_segments_destination",
        "copy_segments",
        ["connector", "destination_topic", "destination_partition", "destination_start"],
    )
    op.create_table(
        "platform_producer_ids",
        sa.Column("cluster_id", sa.Text(), nullable=False),
        sa.Column("producer_id", sa.BigInteger(), nullable=False),
        sa.Column("connector", sa.Text(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("cluster_id", "producer_id", name=op.f("pk_platform_producer_ids")),
    )


def downgrade() -> None:
    op.drop_table("platform_producer_ids")
    op.drop_index("ix_copy_segments_destination", table_name="copy_segments")
    op.drop_table("copy_segments")
