"""metric_samples and metric_totals: what went as record batches, and the batch path's hand-backs by reason

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 09:00:00.000000

With `copy.mode=batches` a task counts per topic the records and bytes it copied as record batches and each time
the batch path handed a partition back to the record path, by reason (a batch that cannot pass, a pause, a
problem): exported as `mirus_batch_replicated_records_total`, `mirus_batch_replicated_bytes_total` and
`mirus_batch_hand_backs_total`.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

TABLES = ("metric_samples", "metric_totals")


def upgrade() -> None:
    for table in TABLES:
        op.add_column(table, sa.Column("batch_records", sa.BigInteger(), server_default="0", nullable=False))
        op.add_column(table, sa.Column("batch_bytes", sa.BigInteger(), server_default="0", nullable=False))
        op.add_column(
            table,
            sa.Column("handed_back", postgresql.JSONB(astext_type=sa.Text()), server_default="{}", nullable=False),
        )


def downgrade() -> None:
    for table in reversed(TABLES):
        op.drop_column(table, "handed_back")
        op.drop_column(table, "batch_bytes")
        op.drop_column(table, "batch_records")
