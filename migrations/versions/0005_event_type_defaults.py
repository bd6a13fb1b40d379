"""event_types.defaults: optional attributes and their defaults (schema evolution)

Revision ID: 0005
Revises: 0004
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("event_types") as batch:
        batch.add_column(sa.Column("defaults", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("event_types") as batch:
        batch.drop_column("defaults")
