"""metric_samples and metric_totals: records written again after a restart

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26 09:00:00.000000

At least once, a task that starts finds at the destination what was copied after its partitions' last commit and
writes it again (unless `resume.after.destination.copies`): counted per topic, exported as
`mirus_records_resent_total`.
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("metric_samples", sa.Column("resent", sa.BigInteger(), server_default="0", nullable=False))
    op.add_column("metric_totals", sa.Column("resent", sa.BigInteger(), server_default="0", nullable=False))


def downgrade() -> None:
    op.drop_column("metric_totals", "resent")
    op.drop_column("metric_samples", "resent")
