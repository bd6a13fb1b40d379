"""Keyset (cursor) paging shared by the list routes: rows after the cursor's id, in id order."""
from __future__ import annotations

from typing import Any

from sqlalchemy import Select
from sqlalchemy.orm import Session

from service.core.errors import ApiError
from service.schemas.common import decode_cursor, encode_cursor


def page(
    session: Session, stmt: Select[Any], id_col: Any, cursor: str | None, limit: int
) -> tuple[list[Any], str | None]:
    """One page of ``stmt`` ordered by ``id_col``: (rows, cursor of the next page or None).

    Raises
    ------
    ApiError
        422 on ``query.cursor`` for a cursor this API did not make.
    """
    stmt = stmt.order_by(id_col).limit(limit + 1)
    if cursor is not None:
        try:
            stmt = stmt.where(id_col > decode_cursor(cursor))
        except ValueError as e:
            raise ApiError(422, str(e), "query.cursor") from None
    rows = list(session.scalars(stmt))
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, encode_cursor(rows[-1].id) if more else None
