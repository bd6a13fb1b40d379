"""backfills: runs of a registered query over archived history on Spark (docs/architecture.md section 7.11)

Revision ID: 0003
Revises: 0002
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "backfills",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("query_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("query_version", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("from_us", sa.BigInteger(), nullable=False),
        sa.Column("to_us", sa.BigInteger(), nullable=False),
        sa.Column("deliver", sa.Boolean(), nullable=False),
        sa.Column("percent", sa.Float(), nullable=False),
        sa.Column("events_scanned", sa.BigInteger(), nullable=False),
        sa.Column("matches", sa.BigInteger(), nullable=True),
        sa.Column("alerts", sa.BigInteger(), nullable=True),
        sa.Column("versions", sa.JSON(), nullable=True),
        sa.Column("error", sa.String(length=1000), nullable=True),
        sa.Column("created_at_us", sa.BigInteger(), nullable=False),
        sa.Column("started_at_us", sa.BigInteger(), nullable=True),
        sa.Column("finished_at_us", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["query_id"], ["queries.id"], name=op.f("fk_backfills_query_id_queries"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_backfills")),
        sa.UniqueConstraint("run_id", name=op.f("uq_backfills_run_id")),
    )
    op.create_index("ix_backfills_query_id", "backfills", ["query_id"])
    op.create_index("ix_backfills_state", "backfills", ["state"])


def downgrade() -> None:
    op.drop_index("ix_backfills_state", table_name="backfills")
    op.drop_index("ix_backfills_query_id", table_name="backfills")
    op.drop_table("backfills")
