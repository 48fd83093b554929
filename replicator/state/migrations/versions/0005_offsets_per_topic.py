"""offsets per topic: one row per connector and source topic, an array element per partition

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 13:00:00.000000

A task holding thousands of partitions commits them as a few array updates instead of a row each. The stored
offsets move over as they are; the per-partition writer epoch becomes the topic's last writer's.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.rename_table("offsets", "offsets_per_partition")
    op.execute("ALTER TABLE offsets_per_partition RENAME CONSTRAINT pk_offsets TO pk_offsets_per_partition")
    op.create_table(
        "offsets",
        sa.Column("connector", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("positions", postgresql.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("destination_positions", postgresql.ARRAY(sa.BigInteger()), nullable=True),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("connector", "topic", name=op.f("pk_offsets")),
    )
    # Element p + 1 is partition p; array_agg over every partition up to the highest stored leaves gaps NULL.
    op.execute(
        """
        INSERT INTO offsets (connector, topic, positions, destination_positions, epoch, updated_at)
        SELECT o.connector, o.topic,
               array_agg(s."offset" ORDER BY p.n),
               CASE WHEN count(s.destination_offset) > 0 THEN array_agg(s.destination_offset ORDER BY p.n) END,
               max(o.epoch), max(o.updated_at)
        FROM (SELECT connector, topic, max(partition) AS top, max(epoch) AS epoch, max(updated_at) AS updated_at
              FROM offsets_per_partition GROUP BY connector, topic) AS o
        CROSS JOIN LATERAL generate_series(0, o.top) AS p(n)
        LEFT JOIN offsets_per_partition s ON s.connector = o.connector AND s.topic = o.topic AND s.partition = p.n
        GROUP BY o.connector, o.topic
        """
    )
    op.drop_table("offsets_per_partition")


def downgrade() -> None:
    op.rename_table("offsets", "offsets_per_topic")
    op.execute("ALTER TABLE offsets_per_topic RENAME CONSTRAINT pk_offsets TO pk_offsets_per_topic")
    op.create_table(
        "offsets",
        sa.Column("connector", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("destination_offset", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("connector", "topic", "partition", name=op.f("pk_offsets")),
    )
    op.execute(
        """
        INSERT INTO offsets (connector, topic, partition, "offset", epoch, updated_at, destination_offset)
        SELECT t.connector, t.topic, u.n - 1, u.position, t.epoch, t.updated_at, u.destination
        FROM offsets_per_topic t,
             unnest(t.positions, t.destination_positions) WITH ORDINALITY AS u(position, destination, n)
        WHERE u.position IS NOT NULL
        """
    )
    op.drop_table("offsets_per_topic")
