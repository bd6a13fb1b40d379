"""event_types.derived: a type made by EMIT INTO, told apart from an ingested one (issue 24)

A derived type stays derived after its emitters are paused or deleted (producers cannot post it), and a
type registered with POST /event-types is ingested before its first event (EMIT INTO cannot name it).
The types some stored statement emits into are derived.

Revision ID: 0011
Revises: 0010
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("event_types") as batch:
        batch.add_column(sa.Column("derived", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.execute(
        "UPDATE event_types SET derived = TRUE "
        "WHERE name IN (SELECT emits FROM queries WHERE emits IS NOT NULL)"
    )


def downgrade() -> None:
    with op.batch_alter_table("event_types") as batch:
        batch.drop_column("derived")
