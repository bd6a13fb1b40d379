"""queries.resume_seq replaces queries.resume_from_us: a statement's checkpoint is a position in the
durable ingest order, not an event time (issue 24; docs/architecture.md section 4)

Events archived before this revision have no ``ingest_seq``. A statement without a ``resume_seq`` (every
statement right after the upgrade) is rebuilt on its first restart from what it received after
``active_since_us`` within its event-time horizon, as before; its first checkpoint then records a position.

Revision ID: 0012
Revises: 0011
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("queries") as batch:
        batch.add_column(sa.Column("resume_seq", sa.BigInteger(), nullable=True))
        batch.drop_column("resume_from_us")


def downgrade() -> None:
    with op.batch_alter_table("queries") as batch:
        batch.add_column(sa.Column("resume_from_us", sa.BigInteger(), nullable=True))
        batch.drop_column("resume_seq")
