"""partial-match store: spilled partial matches (TPM/STPM, docs/architecture.md section 7.6)

Revision ID: 0002
Revises: 0001
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "partial_matches",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("query_id", sa.String(length=128), nullable=False),
        sa.Column("plan", sa.Integer(), nullable=False),
        sa.Column("partition_key", sa.Text(), nullable=False),
        sa.Column("nfa_state", sa.Integer(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("max_ts_us", sa.BigInteger(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_partial_matches")),
    )
    op.create_index("ix_partial_matches_unit", "partial_matches", ["query_id", "plan", "partition_key", "nfa_state"])
    op.create_index("ix_partial_matches_expiry", "partial_matches", ["query_id", "max_ts_us"])


def downgrade() -> None:
    op.drop_index("ix_partial_matches_expiry", table_name="partial_matches")
    op.drop_index("ix_partial_matches_unit", table_name="partial_matches")
    op.drop_table("partial_matches")
