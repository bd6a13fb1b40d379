"""The partial-match store (PMS) interface and an in-memory implementation.

The SQL implementation (SQLAlchemy; SQLite or PostgreSQL) lives in ``service.db.pm_store`` so that
``engine`` stays free of database imports (docs/architecture.md section 1).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class SpilledBatch:
    """One unit's partial matches written in one row.

    Attributes
    ----------
    query_id : str
    plan : int
    key : str
        The partition key, encoded as stable JSON text.
    slot : int
        NFA state (slot) of run storage, -1 for a whole chain.
    count : int
        Partial matches in the payload.
    max_ts : int
        Latest timestamp that keeps the batch alive (int microseconds): once every window's lower
        bound passes it, the whole batch has expired.
    payload : bytes
        :mod:`engine.pm.codec` encoding (empty in what ``delete_expired`` returns).
    nbytes : int
        Size of the payload in bytes.
    """

    query_id: str
    plan: int
    key: str
    slot: int
    count: int
    max_ts: int
    payload: bytes
    nbytes: int = -1

    def __post_init__(self) -> None:
        if self.nbytes < 0:
            object.__setattr__(self, "nbytes", len(self.payload))


class PartialMatchStore(Protocol):
    """Where spilled partial matches go (PMS) and come back from (PMR)."""

    def write(self, batches: list[SpilledBatch]) -> None:
        """Insert batches in one transaction."""

    def take(self, query_id: str, plan: int, key: str, slot: int) -> list[SpilledBatch]:
        """Read and delete every batch of one unit (a reload), oldest first."""

    def delete_expired(self, query_id: str, lower_ts: int) -> list[SpilledBatch]:
        """Delete batches with ``max_ts < lower_ts``; return them without payloads (``b''``)."""

    def clear(self, query_id: str) -> None:
        """Delete every batch of the query."""


class MemoryStore:
    """A PMS kept in a dict (tests, and runs without a database). Same contract as the SQL store."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, int, str, int], list[SpilledBatch]] = {}

    def write(self, batches: list[SpilledBatch]) -> None:
        for b in batches:
            self._rows.setdefault((b.query_id, b.plan, b.key, b.slot), []).append(b)

    def take(self, query_id: str, plan: int, key: str, slot: int) -> list[SpilledBatch]:
        return self._rows.pop((query_id, plan, key, slot), [])

    def delete_expired(self, query_id: str, lower_ts: int) -> list[SpilledBatch]:
        gone: list[SpilledBatch] = []
        for k in list(self._rows):
            if k[0] != query_id:
                continue
            keep: list[SpilledBatch] = []
            for b in self._rows[k]:
                (gone if b.max_ts < lower_ts else keep).append(b)
            if keep:
                self._rows[k] = keep
            else:
                del self._rows[k]
        return [SpilledBatch(b.query_id, b.plan, b.key, b.slot, b.count, b.max_ts, b"", b.nbytes) for b in gone]

    def clear(self, query_id: str) -> None:
        for k in [k for k in self._rows if k[0] == query_id]:
            del self._rows[k]

