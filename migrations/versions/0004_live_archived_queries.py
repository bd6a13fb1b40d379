"""queries: live-and-archived options (algorithm, T_L), partial-match budget and policy, restart checkpoint

Revision ID: 0004
Revises: 0003
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("queries") as batch:
        batch.add_column(sa.Column("kind", sa.String(length=16), nullable=False, server_default="live"))
        batch.add_column(sa.Column("algorithm", sa.String(length=8), nullable=True))
        batch.add_column(sa.Column("tolerance_us", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("pm_capacity", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("pm_policy", sa.String(length=8), nullable=True))
        batch.add_column(sa.Column("resume_from_us", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("queries") as batch:
        for name in ("resume_from_us", "pm_policy", "pm_capacity", "tolerance_us", "algorithm", "kind"):
            batch.drop_column(name)
