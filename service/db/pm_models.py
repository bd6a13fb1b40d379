"""The partial-match store's table (docs/architecture.md section 7.6): spilled partial matches, one row per batch."""
from __future__ import annotations

from sqlalchemy import BigInteger, Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from service.db.models import Base, BigId


class PartialMatchRow(Base):
    """A batch of spilled partial matches of one unit: (query, plan, partition key, NFA state).

    ``nfa_state`` is the slot for run storage and -1 for a whole chain of chain-partitioned storage;
    ``max_ts_us`` is the latest timestamp that keeps the batch alive (expiry); ``payload`` is the
    :mod:`engine.pm.codec` encoding (versioned JSON, no pickle).
    """

    __tablename__ = "partial_matches"
    __table_args__ = (
        Index("ix_partial_matches_unit", "query_id", "plan", "partition_key", "nfa_state"),
        Index("ix_partial_matches_expiry", "query_id", "max_ts_us"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    query_id: Mapped[str] = mapped_column(String(128))
    plan: Mapped[int] = mapped_column(Integer)
    partition_key: Mapped[str] = mapped_column(Text)
    nfa_state: Mapped[int] = mapped_column(Integer)
    count: Mapped[int] = mapped_column(Integer)
    max_ts_us: Mapped[int] = mapped_column(BigInteger)
    payload: Mapped[bytes] = mapped_column(LargeBinary)
