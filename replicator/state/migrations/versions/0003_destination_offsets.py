"""offsets.destination_offset: where exactly-once resume reads the destination from

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 10:30:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("offsets", sa.Column("destination_offset", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("offsets", "destination_offset")
