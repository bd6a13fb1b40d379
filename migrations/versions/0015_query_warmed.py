"""queries.warmed: a statement version started with ``?state=warm`` keeps the history warming gave it across a
restart (the restart replay feeds it the events of its horizon ingested before it started too; docs/architecture.md
section 4)

Revision ID: 0015
Revises: 0014
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("queries") as batch:
        batch.add_column(sa.Column("warmed", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("queries") as batch:
        batch.drop_column("warmed")
