"""The alert of the service, converted in one place (one model per concept).

An alert (a match of a registered query, made by :mod:`service.live.outbox`, a delivering backfill or an import of
results found elsewhere) is stored as an :class:`~service.db.models.AlertRow` (times int microseconds UTC);
:func:`public` gives its REST shape :class:`~service.schemas.alerts.AlertPublic` (times ISO-8601), :func:`selection`
the rows ``GET /alerts`` lists, :func:`import_results` records ``POST /queries/{id}/results``'s matches.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from sqlalchemy import Select, select

from service.core.errors import ApiError, get_or_404
from service.db.models import AlertRow, QueryRow
from service.schemas.alerts import AlertPublic, MatchIn, ResultsImported
from service.schemas.common import iso

if TYPE_CHECKING:
    from service.live.runtime import LiveRuntime


def public(row: AlertRow) -> AlertPublic:
    """The REST shape of ``row``: the match's events, bounds (``start``, ``end``) and RETURN fields, with its
    query's id and version and when it was detected (times ISO-8601)."""
    return AlertPublic(
        id=row.id,
        query_id=row.query_id,
        query_version=row.query_version,
        events=row.events,
        start=iso(row.start_us),
        end=iso(row.end_us),
        fields=row.fields,
        detected_at=iso(row.created_at_us),
    )


def selection(query_id: int | None, since_us: int | None, until_us: int | None) -> Select[Any]:
    """The alerts of query ``query_id`` whose match ends in ``[since_us, until_us)`` (int us UTC); None: any."""
    stmt = select(AlertRow)
    if query_id is not None:
        stmt = stmt.where(AlertRow.query_id == query_id)
    if since_us is not None:
        stmt = stmt.where(AlertRow.end_us >= since_us)
    if until_us is not None:
        stmt = stmt.where(AlertRow.end_us < until_us)
    return stmt


def import_results(runtime: LiveRuntime, query_id: int, body: bytes, content_type: str) -> ResultsImported:
    """Record the matches of ``body`` as alerts of query ``query_id`` (any state: active, paused, failed), each
    delivered to the query's webhooks unless the query already alerted it (same event ids); all or nothing.

    ``body`` is NDJSON (``application/x-ndjson``: one match object per line, as ``lace match`` and ``lace stream``
    write them, :class:`~service.schemas.alerts.MatchIn`) or a JSON array of such objects. A match's ``query`` must
    be the statement's NAME (null for a statement without one) or the query's name.

    Raises
    ------
    ApiError
        404 on ``path.id`` for an unknown query; 400 on ``body`` for malformed JSON (line and column); 422 with
        the ``line`` (NDJSON) or ``index`` (JSON array) of the first match that is not a match object, or is one
        of another statement (naming both): nothing is recorded then.
    """
    from engine.lql.errors import QueryError
    from engine.lql.parser import parse_script
    from service.core.errors import malformed_json
    from service.live.events import BodyError, parse_body

    with runtime.results.sessions() as session:
        row = get_or_404(session, QueryRow, query_id, "query")
        name, version = row.name, row.version
        text = row.text
    try:
        trees = parse_script(text)
    except QueryError:  # registered text that no longer parses: only the query's name
        trees = []
    names = {name, *(getattr(t, "name", None) for t in trees[:1])}
    try:
        items = parse_body(body, content_type) if body.strip() else []
    except BodyError as e:
        if e.line is not None and e.column is not None:
            raise malformed_json(e.reason, e.line, e.column) from None
        raise ApiError(
            422, "the body must be NDJSON (one match object per line) or a JSON array of them", "body"
        ) from None
    docs = [_match_doc(raw, line, i, names, query_id) for i, (raw, line) in enumerate(items)]
    alerts = runtime.results.import_docs(query_id, version, docs) if docs else 0
    return ResultsImported(received=len(docs), alerts=alerts, duplicates=len(docs) - alerts)


def _match_doc(raw: Any, line: int | None, index: int, names: set[str | None], query_id: int) -> dict[str, Any]:
    """The match object ``raw`` (``line`` of an NDJSON body, else item ``index`` of a JSON array), checked."""
    where: dict[str, int] = {"line": line} if line is not None else {"index": index}
    at = f"line {line}" if line is not None else f"item {index}"
    try:
        match = MatchIn.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.get("loc", ()))
        what = f"{loc.lstrip('.')}: " if loc else ""
        raise ApiError(
            422, f"{at}: not a match object of lace match: {what}{err.get('msg', 'invalid')}", f"body{loc}", **where
        ) from None
    if match.query not in names:
        expected = " or ".join(sorted("null" if n is None else repr(n) for n in names))
        raise ApiError(
            422, f"{at}: a match of statement {match.query!r}, not of query {query_id} ({expected})", "body.query",
            **where,
        )
    doc = match.model_dump()
    if doc["start"] > doc["end"]:
        raise ApiError(422, f"{at}: start {doc['start']} is after end {doc['end']}", "body.start", **where)
    return doc
