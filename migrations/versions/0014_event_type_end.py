"""event_types.ended_at_us, event_types.end_ts_us: a stream ended by ``POST /event-types/{name}/end`` stays ended
across restarts (issue 25; docs/operations.md, *Ending a stream*)

Revision ID: 0014
Revises: 0013
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("event_types") as batch:
        batch.add_column(sa.Column("ended_at_us", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("end_ts_us", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("event_types") as batch:
        batch.drop_column("end_ts_us")
        batch.drop_column("ended_at_us")
