"""webhook hardening: pause, secret rotation, circuit breaker, soft delete (issue 13)

Revision ID: 0006
Revises: 0005
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (
    sa.Column("previous_salt", sa.String(length=64), nullable=True),
    sa.Column("previous_salt_until_us", sa.BigInteger(), nullable=True),
    sa.Column("circuit", sa.String(length=16), server_default="closed", nullable=False),
    sa.Column("failures", sa.Integer(), server_default="0", nullable=False),
    sa.Column("opened_at_us", sa.BigInteger(), nullable=True),
    sa.Column("probe_at_us", sa.BigInteger(), nullable=True),
    sa.Column("deleted_at_us", sa.BigInteger(), nullable=True),
)


def upgrade() -> None:
    # Idempotency keys already issued (lace-<alert id>-<webhook id>) stay as they are: the new ones
    # (lace-<UUIDv7>) cannot collide with them.
    with op.batch_alter_table("webhooks") as batch:
        for col in COLUMNS:
            batch.add_column(col)


def downgrade() -> None:
    op.execute("DELETE FROM webhooks WHERE deleted_at_us IS NOT NULL")
    op.execute("UPDATE deliveries SET status = 'dead' WHERE status = 'cancelled'")
    with op.batch_alter_table("webhooks") as batch:
        for col in reversed(COLUMNS):
            batch.drop_column(col.name)
