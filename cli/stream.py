"""``lace stream``: a live-only statement over an event file, or over the archive's Delta events tables, detected
by Spark Structured Streaming (issue 26); or a live-and-archived statement over either, its archived side read from
the same Delta tables: over a file, the file's events are both the live stream and the archive, as ``lace replay``
plays them (OUT then as ``lace replay --out``).

Reads the query and the event file as ``lace match`` does and writes OUT with the same writer, so the two outputs
compare byte for byte; the detection runs in :mod:`stream` (docs/stream.md). With ``--archive ROOT`` instead of
``--events`` the events are the archive's (``<ROOT>/<type>``, :mod:`stream.archive_source`). A statement that cannot
run there is refused up front (one error line, exit 2; :mod:`stream.statements`), as is an event type the statement
reads without a table in the archive. ``--deliver URL --query-id N`` then sends OUT's matches to a running service
as that statement's alerts (:mod:`cli.deliver`); with ``--follow`` the query over the archive is left running and
each micro-batch's matches are sent as it finds them (:func:`stream.job.follow`), until SIGTERM or SIGINT.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from cli.app import MAX_LATE_REPORTS, Strategy, TsUnitChoice, app, fail, read_text, warn
from cli.deliver import API_KEY_ENV, Delivered, DeliverError, ResultsClient
from cli.match import MatchFormatChoice, _open_out_binary, event_file_options
from engine.durations import parse_duration_us

if TYPE_CHECKING:
    from engine.events import Event
    from stream.job import StreamJob


@app.command()
def stream(
    query: Annotated[
        Path, typer.Option("--query", "-q", help="LQL file of one statement (live-only or live-and-archived).")
    ],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write matches here (as `lace match --out`); not with --follow.")
    ] = None,
    events: Annotated[
        Path | None, typer.Option("--events", "-e", help="Event file: CSV (id,type,ts,...), JSONL or Parquet.")
    ] = None,
    archive: Annotated[
        Path | None,
        typer.Option(help="Instead of --events: the archive root (LACE_ARCHIVE_ROOT); reads its Delta events tables."),
    ] = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option(help="Folder for the source table, results and Spark checkpoint; a rerun with it resumes."),
    ] = None,
    master: Annotated[
        str | None, typer.Option(help="Spark master, e.g. local[2] (default LACE_SPARK_MASTER, else local[*]).")
    ] = None,
    batch_events: Annotated[int, typer.Option(help="Events per micro-batch.", min=1)] = 50_000,
    strategy: Annotated[Strategy | None, typer.Option(help="Override the query's STRATEGY.")] = None,
    format: Annotated[MatchFormatChoice, typer.Option("--format", help="Match output format.")] = (
        MatchFormatChoice.jsonl
    ),
    schema: Annotated[
        Path | None, typer.Option("--schema", help="JSON file of column types, e.g. {\"key\": \"string\"}.")
    ] = None,
    lateness: Annotated[
        str, typer.Option(help="Allowed lateness, e.g. '5 seconds': later events are rejected; the watermark delay.")
    ] = "0",
    ts_unit: Annotated[TsUnitChoice, typer.Option(help="Unit of numeric ts: auto = int ms, decimal s.")] = (
        TsUnitChoice.auto
    ),
    sort: Annotated[bool, typer.Option("--sort", help="Sort the file by (ts, id) first (reads it all).")] = False,
    deliver: Annotated[
        str | None,
        typer.Option(help="After the run, send OUT's matches to this LACE service (base URL, e.g. "
                     "http://127.0.0.1:8080) as alerts of --query-id, delivered to its webhooks once."),
    ] = None,
    query_id: Annotated[
        int | None, typer.Option(help="With --deliver: the service's id of this statement.", min=1)
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(help="With --deliver: an API key of scope admin.", envvar=API_KEY_ENV)
    ] = None,
    follow: Annotated[
        bool,
        typer.Option("--follow", help="With --archive, --checkpoint and --deliver: leave the query running, a "
                     "micro-batch every --trigger over what was archived since, each one's matches sent to the "
                     "service; SIGTERM or Ctrl-C stops it (a rerun with the checkpoint goes on)."),
    ] = False,
    trigger: Annotated[
        str, typer.Option(help="With --follow: the time between micro-batches, e.g. '5 seconds'.")
    ] = "5 seconds",
    deliver_tail: Annotated[
        bool,
        typer.Option("--deliver-tail", help="With --deliver --archive: also send the matches only the end of the "
                     "events read gives (a later event could still cancel them): when no more will be archived."),
    ] = False,
) -> None:
    """Run a live-only statement over an event file or the archive on Spark Structured Streaming; OUT as
    `lace match` writes it. A live-and-archived statement runs over an event file (the file is also the archive,
    as with `lace replay`) or over the archive; OUT as `lace replay --out` writes it.

    The events go through a Delta table read by readStream (with --archive: the archive's tables of the statement's
    event types), keyed by PARTITION BY; the engine's matcher runs per key in transformWithStateInPandas (RocksDB
    state store, event-time timers, the lateness as the watermark). A live-and-archived statement's live
    instances of each micro-batch are joined with the archived side by a Spark join over the same Delta tables.
    With --archive and --checkpoint, a rerun reads
    only what was archived since and writes the matches of all events read so far. With --deliver and
    --query-id, OUT's matches then go to the service (POST /queries/{id}/results): the new ones become the
    statement's alerts, delivered to its webhooks; the ones it already alerted are not delivered again. With
    --archive, the matches of the run's tail (which a newer event could still cancel) are not sent unless
    --deliver-tail says that no more events will come. With --archive --checkpoint --deliver --follow, the query
    is left running (a micro-batch every --trigger over what was archived since, each one's matches sent to the
    service) until SIGTERM or Ctrl-C.
    """
    if (deliver is None) != (query_id is None):
        fail("give both --deliver URL and --query-id N, or neither")
    if deliver is not None and not deliver.lower().startswith(("http://", "https://")):
        fail(f"--deliver {deliver}: give the service's base URL, e.g. http://127.0.0.1:8080")
    if deliver_tail and deliver is None:
        fail("--deliver-tail is an option of --deliver")
    trigger_s = None
    if follow:
        if archive is None or checkpoint is None or deliver is None:
            fail("--follow needs --archive ROOT, --checkpoint DIR and --deliver URL --query-id N (a query left "
                 "running reads the archive and sends each micro-batch's matches to the service)")
        if out is not None or deliver_tail:
            fail("--out and --deliver-tail are options of a bounded run, not of --follow (it has no end: its "
                 "matches go to --deliver as each micro-batch finds them)")
        try:
            trigger_s = parse_duration_us(trigger) / 1e6
        except ValueError as e:
            fail(f"--trigger: {e}")
        if trigger_s <= 0:
            fail("--trigger: give a positive duration, e.g. '5 seconds'")
    elif out is None:
        fail("give --out FILE (or --follow to leave the query running)")
    text = read_text(query)
    if (events is None) == (archive is None):
        fail("give either --events FILE or --archive ROOT")
    if archive is not None:
        if not archive.is_dir():
            fail(f"{archive}: no such folder (the archive root)")
        if schema is not None or sort:
            fail("--schema and --sort are options of --events (the archive's tables are typed and in commit order)")
        try:
            column_types, lateness_us = None, parse_duration_us(lateness)
        except ValueError as e:
            fail(f"--lateness: {e}")
    else:
        assert events is not None
        column_types, lateness_us = event_file_options(events, schema, lateness)

    from engine.compiler import compile_query
    from engine.io import EventFileError, open_event_file
    from engine.live_archived.plan import compile_live_archived
    from engine.lql.ast import LiveArchivedQuery, PatternQuery
    from engine.lql.errors import QueryError
    from engine.lql.parser import parse_script
    from engine.match_files import MatchWriter
    from stream.statements import refusal

    try:
        trees = parse_script(text)
    except QueryError as e:
        fail(f"{query}:{e.line}:{e.column}: {e.reason}")
    if not trees:
        fail(f"{query}: no statement")
    compiled = None
    plan = None
    reason = refusal(trees)
    if reason is None:
        try:
            if isinstance(trees[0], LiveArchivedQuery):
                if strategy is not None:
                    fail("--strategy is not an option of a live-and-archived statement (as with lace replay)")
                plan = compile_live_archived(trees[0])
                compiled = plan.live
            else:
                compiled = compile_query(cast(PatternQuery, trees[0]), strategy=strategy.value if strategy else None)
        except QueryError as e:
            fail(f"{query}:{e.line}:{e.column}: {e.reason}")
        reason = refusal(trees, compiled)
    if reason is not None or compiled is None:
        tree = trees[0]
        name = getattr(tree, "name", None) or "statement_1"
        fail(f"{query}:{tree.pos.line}:{tree.pos.column}: statement {name} cannot run on Spark: {reason}")

    if deliver is not None:
        with ResultsClient(deliver, cast(int, query_id), api_key) as client:
            try:
                client.check()  # before Spark starts: the service answers, the key may import, the query exists
            except DeliverError as e:
                fail(str(e))

    from stream import job as stream_job
    from stream.job import StreamJob, StreamJobError, accepted_events, run

    n_late = 0
    if archive is not None:
        from stream.archive_source import MissingTableError, archive_types, event_tables

        try:  # before Spark starts
            archive_types(archive, list(event_tables(archive, (plan or compiled).stream_types)))
        except MissingTableError as e:
            fail(str(e))
        accepted: Iterator[Event] = iter(())  # the archive's tables are the source
    else:
        assert events is not None
        try:
            source = open_event_file(events, ts_unit=ts_unit.value, schema=column_types)
        except EventFileError as e:
            fail(str(e))
        for message in source.warnings():
            warn(message)
        if sort:
            source.sort()

        def on_late(position: int, reason: str) -> None:
            nonlocal n_late
            n_late += 1
            if n_late <= MAX_LATE_REPORTS:
                warn(f"{events} {source.where(position)}: {reason}")

        types = plan.stream_types if plan is not None else None
        accepted = accepted_events(source.events(), compiled, lateness_us, on_late, types)
    job = StreamJob(
        text=text, query=compiled, strategy=strategy.value if strategy else None, lateness_us=lateness_us,
        master=master, batch_events=batch_events, checkpoint=checkpoint, archive=archive, plan=plan,
        trigger_s=trigger_s,
    )
    if follow:
        _follow(job, cast(str, deliver), cast(int, query_id), api_key, lateness)
        return
    assert out is not None
    try:
        found = list(run(job, accepted))
    except StreamJobError as e:
        fail(str(e))
    if n_late > MAX_LATE_REPORTS:
        warn(f"{n_late - MAX_LATE_REPORTS} more late events rejected ({n_late} in all)")
    dropped = stream_job.dropped_by_watermark(stream_job.progress)
    if archive is not None and dropped:
        warn(f"{dropped} events behind the watermark (the newest event time read before, minus the lateness "
             f"{lateness}) were dropped by this run (raise --lateness)")
    if stream_job.late:
        ts, i = stream_job.late[0]
        warn(f"{len(stream_job.late)} events rejected as late by their key's matcher, in all runs of this "
             f"checkpoint (the first: id {i}, ts {ts}; raise --lateness)")
    with MatchWriter(_open_out_binary(out), format.value) as sink:
        sink.write(found)
    if deliver is not None:
        from engine.match_files import match_line

        held = set() if deliver_tail else stream_job.tail_keys  # empty in the file mode: its end is the file's
        final = [m for m in found if m.key() not in held] if held else found
        with ResultsClient(deliver, cast(int, query_id), api_key) as client:
            try:
                got = client.send(match_line(m).encode() + b"\n" for m in final)
            except DeliverError as e:
                fail(str(e), code=1)
        typer.echo(f"delivered to {deliver} query {query_id}: {got.received} matches, {got.alerts} new alerts, "
                   f"{got.duplicates} already alerted")
        if len(final) < len(found):
            typer.echo(f"not delivered: {len(found) - len(final)} matches of the end of the events read (a newer "
                       f"event could still cancel them; a later run sends them once final, --deliver-tail now)")


def _follow(job: StreamJob, deliver: str, query_id: int, api_key: str | None, lateness: str) -> None:
    """``--follow``: :func:`stream.job.follow` until SIGTERM or SIGINT; each micro-batch's matches to the service, one
    line per micro-batch with matches on stdout, late and watermark-dropped events on stderr."""
    import signal
    import threading

    from engine.match_files import match_line
    from stream.job import StreamJobError, dropped_by_watermark, follow

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    total = Delivered()

    with ResultsClient(deliver, query_id, api_key) as client:

        def send(matches: list[Any], late: int, batch_id: int) -> None:
            if late:
                warn(f"micro-batch {batch_id}: {late} events rejected as late by their key's matcher, not matched "
                     f"(raise --lateness)")
            if not matches:
                return
            got = client.send(match_line(m).encode() + b"\n" for m in matches)  # DeliverError: the query fails
            total.received += got.received
            total.alerts += got.alerts
            total.duplicates += got.duplicates
            typer.echo(f"micro-batch {batch_id}: delivered {got.received} matches to {deliver} query {query_id}: "
                       f"{got.alerts} new alerts, {got.duplicates} already alerted")

        def dropped(report: dict[str, Any]) -> None:
            n = dropped_by_watermark([report])
            if n:
                warn(f"micro-batch {report.get('batchId')}: {n} events behind the watermark (the newest event time "
                     f"read before, minus the lateness {lateness}) were dropped (raise --lateness)")

        try:
            batches = follow(job, send, stop, dropped)
        except StreamJobError as e:
            fail(str(e), code=1)
    typer.echo(f"stopped after {batches} micro-batches: delivered {total.received} matches, {total.alerts} new "
               f"alerts, {total.duplicates} already alerted")
