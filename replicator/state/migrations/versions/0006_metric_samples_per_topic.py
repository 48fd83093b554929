"""metric samples per topic: one row per task, source topic and interval instead of one per partition

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 16:00:00.000000

Metric storage grows with topics, not partitions (each partition's latest lag is in `partition_lags`). The stored
samples of one task's interval are summed per topic: records, bytes, latency sums and counts, histograms bound by
bound, min of the minimums, max of the maximums, and the lags (of the partitions sampled in that interval). A
summed row keeps its group's lowest id, so the lake's incremental export of the running hour (ids above the last
exported) neither misses nor repeats it.

The downgrade cannot split a topic's row again: every row becomes one of partition -1 (the whole topic).
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_GROUP = "connector, task_id, topic, interval_start, interval_end"


def upgrade() -> None:
    op.alter_column("metric_samples", "partition", existing_type=sa.Integer(), nullable=True)
    op.execute(
        f"""
        WITH old AS (DELETE FROM metric_samples RETURNING *),
        sums AS (
            SELECT min(id) AS id, {_GROUP}, sum(records) AS records, sum(bytes) AS bytes,
                   min(latency_min_ms) AS latency_min_ms, max(latency_max_ms) AS latency_max_ms,
                   sum(latency_sum_ms) AS latency_sum_ms, sum(latency_count) AS latency_count, sum(lag) AS lag
            FROM old GROUP BY {_GROUP}),
        buckets AS (
            SELECT {_GROUP}, h.key, sum(h.value::bigint) AS total
            FROM old, jsonb_each_text(old.latency_histogram) AS h GROUP BY {_GROUP}, h.key),
        histograms AS (
            SELECT {_GROUP}, jsonb_object_agg(key, total) AS histogram FROM buckets GROUP BY {_GROUP})
        INSERT INTO metric_samples (id, {_GROUP}, records, bytes, latency_min_ms, latency_max_ms, latency_sum_ms,
                                    latency_count, latency_histogram, lag)
        SELECT id, {_GROUP}, records, bytes, latency_min_ms, latency_max_ms, latency_sum_ms, latency_count,
               coalesce(histogram, '{{}}'::jsonb), lag
        FROM sums LEFT JOIN histograms USING ({_GROUP})
        """
    )
    op.drop_column("metric_samples", "partition")


def downgrade() -> None:
    op.add_column("metric_samples", sa.Column("partition", sa.Integer(), server_default="-1", nullable=False))
    op.alter_column("metric_samples", "partition", existing_type=sa.Integer(), server_default=None)
