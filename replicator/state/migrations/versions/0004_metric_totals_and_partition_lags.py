"""metric_totals and partition_lags: counters that pruning never lowers, and each partition's latest lag; samples
indexed by time

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25 10:30:00.000000

Both are filled from the samples already stored, so that no counter starts again from zero at the upgrade.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "metric_totals",
        sa.Column("connector", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("records", sa.BigInteger(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("latency_sum_ms", sa.BigInteger(), nullable=False),
        sa.Column("latency_count", sa.BigInteger(), nullable=False),
        sa.Column("latency_histogram", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("connector", "topic", name=op.f("pk_metric_totals")),
    )
    op.create_table(
        "partition_lags",
        sa.Column("connector", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("lag", sa.BigInteger(), nullable=True),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("connector", "topic", "partition", name=op.f("pk_partition_lags")),
    )
    op.create_index("ix_metric_samples_interval_end", "metric_samples", ["interval_end"])
    op.execute(
        """
        INSERT INTO metric_totals (connector, topic, records, bytes, latency_sum_ms, latency_count, latency_histogram)
        SELECT s.connector, s.topic, sum(s.records), sum(s.bytes), sum(s.latency_sum_ms), sum(s.latency_count),
               coalesce((SELECT jsonb_object_agg(b.key, b.total) FROM (
                   SELECT h.key, sum(h.value::bigint) AS total
                   FROM metric_samples m, jsonb_each_text(m.latency_histogram) AS h
                   WHERE m.connector = s.connector AND m.topic = s.topic GROUP BY h.key) AS b), '{}'::jsonb)
        FROM metric_samples s GROUP BY s.connector, s.topic
        """
    )
    op.execute(
        """
        INSERT INTO partition_lags (connector, topic, partition, lag, measured_at)
        SELECT DISTINCT ON (connector, topic, partition) connector, topic, partition, lag, interval_end
        FROM metric_samples ORDER BY connector, topic, partition, interval_end DESC, id DESC
        """
    )


def downgrade() -> None:
    op.drop_index("ix_metric_samples_interval_end", table_name="metric_samples")
    op.drop_table("partition_lags")
    op.drop_table("metric_totals")
