"""event_types.interval and max_duration_us: interval event types (issue 15)

Revision ID: 0009
Revises: 0008
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("event_types") as batch:
        batch.add_column(sa.Column("interval", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("max_duration_us", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("event_types") as batch:
        batch.drop_column("max_duration_us")
        batch.drop_column("interval")
