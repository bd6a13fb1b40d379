"""queries.checkpoint_seq: the position in the durable ingest order at which a statement's checkpoint was taken;
every result of the events before it was recorded then, so the restart replay does not alert them again
(issue 24; docs/architecture.md section 4)

A statement without one (every statement right after the upgrade, and every live-and-archived query, whose results
come from its worker later) has its replayed results de-duplicated by their identity only, as before.

Revision ID: 0013
Revises: 0012
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("queries") as batch:
        batch.add_column(sa.Column("checkpoint_seq", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("queries") as batch:
        batch.drop_column("checkpoint_seq")
