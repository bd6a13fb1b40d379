"""layered rules (003): queries.emits (EMIT INTO), alerts.query_version

Revision ID: 0008
Revises: 0007
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("queries") as batch:
        batch.add_column(sa.Column("emits", sa.String(64), nullable=True))
    with op.batch_alter_table("alerts") as batch:
        batch.add_column(sa.Column("query_version", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("alerts") as batch:
        batch.drop_column("query_version")
    with op.batch_alter_table("queries") as batch:
        batch.drop_column("emits")
