"""flows: the last topic ACL sync that succeeded, and how many destination ACLs it mirrored

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 07:10:00.000000

Shown on the `connectors` asset beside the clusters: a failed sync was already a flow problem; a working one showed
nothing.
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("flows", sa.Column("acls_synced_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("flows", sa.Column("acls_mirrored", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("flows", "acls_mirrored")
    op.drop_column("flows", "acls_synced_at")
