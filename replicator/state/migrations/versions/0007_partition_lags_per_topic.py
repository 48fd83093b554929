"""partition lags per topic: one row per connector and source topic, an array element per partition

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 19:00:00.000000

A task's interval writes its changed lags as one row per topic instead of one per partition. Each partition keeps
when its lag was measured (a parallel array): two tasks share a topic, and a late report of an older interval must
lose only where a newer measurement of the same partition is stored. The stored lags move over as they are, a NULL
lag (no usable end offset) included; the downgrade turns every measured element back into a row.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.rename_table("partition_lags", "lags_per_partition")
    op.execute("ALTER TABLE lags_per_partition RENAME CONSTRAINT pk_partition_lags TO pk_lags_per_partition")
    op.create_table(
        "partition_lags",
        sa.Column("connector", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("lags", postgresql.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("measured_at", postgresql.ARRAY(sa.DateTime(timezone=True)), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("connector", "topic", name=op.f("pk_partition_lags")),
    )
    # Element p + 1 is partition p; array_agg over every partition up to the highest stored leaves gaps NULL.
    op.execute(
        """
        INSERT INTO partition_lags (connector, topic, lags, measured_at, updated_at)
        SELECT t.connector, t.topic, array_agg(l.lag ORDER BY p.n), array_agg(l.measured_at ORDER BY p.n),
               max(t.updated_at)
        FROM (SELECT connector, topic, max(partition) AS top, max(measured_at) AS updated_at
              FROM lags_per_partition GROUP BY connector, topic) AS t
        CROSS JOIN LATERAL generate_series(0, t.top) AS p(n)
        LEFT JOIN lags_per_partition l
          ON l.connector = t.connector AND l.topic = t.topic AND l.partition = p.n
        GROUP BY t.connector, t.topic
        """
    )
    op.drop_table("lags_per_partition")


def downgrade() -> None:
    op.rename_table("partition_lags", "lags_per_topic")
    op.execute("ALTER TABLE lags_per_topic RENAME CONSTRAINT pk_partition_lags TO pk_lags_per_topic")
    op.create_table(
        "partition_lags",
        sa.Column("connector", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("lag", sa.BigInteger(), nullable=True),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("connector", "topic", "partition", name=op.f("pk_partition_lags")),
    )
    op.execute(
        """
        INSERT INTO partition_lags (connector, topic, partition, lag, measured_at)
        SELECT t.connector, t.topic, u.n - 1, u.lag, u.measured_at
        FROM lags_per_topic t, unnest(t.lags, t.measured_at) WITH ORDINALITY AS u(lag, measured_at, n)
        WHERE u.measured_at IS NOT NULL
        """
    )
    op.drop_table("lags_per_topic")
