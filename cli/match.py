"""``lace match``: a live-only query over an event file, one JSON object per match.

See docs/architecture.md section 7.12.
"""
from __future__ import annotations

import contextlib
import gc
import json
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, BinaryIO

import typer

from cli.app import (
    MAX_LATE_REPORTS,
    PmCapacityOption,
    PmPolicy,
    PmPolicyOption,
    PmStoreOption,
    Storage,
    Strategy,
    TsUnitChoice,
    app,
    fail,
    parse_duration_us,
    read_text,
    silence_stdout,
    warn,
)
from engine.io import EventFileError, open_event_file

MATCH_GC_THRESHOLD = 1_000_000
"""Allocations between young collections while ``lace match`` runs a file (CPython's default: 700). CPython counts
tracked objects allocated minus those freed: a run whose live objects stay below it (P1-any: one batch of events and
the window's partial matches) is never collected; one whose state grows is, every million objects."""


class MatchFormatChoice(StrEnum):
    """Output format of ``lace match`` (``engine.match_files``)."""

    jsonl = "jsonl"
    parquet = "parquet"


@app.command()
def match(
    query: Annotated[
        list[Path],
        typer.Option(
            "--query",
            "-q",
            help="LQL query file; repeat it, or put several statements separated by ';' in one file, to run "
            "them as one rule graph (FILTER, EMIT INTO, AGGREGATE).",
        ),
    ],
    events: Annotated[
        Path, typer.Option("--events", "-e", help="Event file: CSV (id,type,ts,...), JSONL or Parquet.")
    ],
    strategy: Annotated[Strategy | None, typer.Option(help="Override the query's STRATEGY.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write matches here; default stdout.")] = None,
    format: Annotated[MatchFormatChoice, typer.Option("--format", help="Match output format.")] = (
        MatchFormatChoice.jsonl
    ),
    schema: Annotated[
        Path | None, typer.Option("--schema", help="JSON file of column types, e.g. {\"key\": \"string\"}.")
    ] = None,
    stats: Annotated[bool, typer.Option("--stats", help="Print counters as JSON on stderr.")] = False,
    storage: Annotated[Storage, typer.Option(help="Partial-match storage.")] = Storage.chain,
    lateness: Annotated[str, typer.Option(help="Allowed lateness, e.g. '5 seconds'; later events are rejected.")] = "0",
    ts_unit: Annotated[TsUnitChoice, typer.Option(help="Unit of numeric ts: auto = int ms, decimal s.")] = (
        TsUnitChoice.auto
    ),
    sort: Annotated[bool, typer.Option("--sort", help="Sort the file by (ts, id) first (reads it all).")] = False,
    pm_capacity: PmCapacityOption = None,
    pm_policy: PmPolicyOption = PmPolicy.stpm,
    pm_store: PmStoreOption = None,
) -> None:
    """Run live-only queries over an event file (CSV, JSONL or Parquet); one JSON object per match.

    Several statements run as one rule graph: FILTER rules first, EMIT INTO statements feed the statements
    that read their derived type, and every statement's output is written with its query name (the results
    of EMIT INTO statements, i.e. the derived events, included).
    """
    texts = [(path, read_text(path)) for path in query]
    column_types, lateness_us = event_file_options(events, schema, lateness)

    from engine.detector import compile_statement
    from engine.lql.errors import QueryError
    from engine.lql.parser import parse_script
    from engine.matcher import Matcher

    statements: list[tuple[Path, Any]] = []
    for path, text in texts:
        try:
            statements.extend((path, q) for q in parse_script(text))
        except QueryError as e:
            fail(f"{path}:{e.line}:{e.column}: {e.reason}")
    if not statements:
        fail(f"{query[0]}: no statement")
    compiled: Any = None  # one statement whose detector runs alone (a live pattern query, what its class declares)
    if len(statements) == 1:
        path, tree = statements[0]
        try:
            one = compile_statement(tree, strategy=strategy.value if strategy else None)
        except QueryError as e:
            fail(f"{path}:{e.line}:{e.column}: {e.reason}")
        if one.runs_alone and one.emit_into is None:
            compiled = one
    store_cm: Any = contextlib.nullcontext()  # SQLAlchemy is imported only for a partial-match store
    if pm_capacity is not None:
        from service.db.pm_store import open_pm_store

        store_cm = open_pm_store(pm_store or "", fail)
    with store_cm as store:

        options: dict[str, Any] = {
            "storage": storage.value,
            "allowed_lateness_us": lateness_us,
            "pm_capacity": pm_capacity,
            "pm_policy": pm_policy.value,
            "pm_store": store,
        }
        if compiled is not None:
            runner: Any = Matcher(compiled, **options, pm_query_id=None)
        else:
            runner = _graph_run(statements, strategy.value if strategy else None, lateness_us, options)
        _run_match(runner, events, ts_unit, sort, out, stats, format.value, column_types)


class _GraphRun:
    """A rule graph behind the matcher's verbs for :func:`_run_match`: filters, then the statements."""

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self.dropped = 0

    def push(self, event: Any) -> list[Any]:
        if self.graph.filter(event) is not None:
            self.dropped += 1
            return []
        out = [m for _, m in self.graph.push(event)]
        self._check_plugins()
        return out

    def flush(self) -> list[Any]:
        out = [m for _, m in self.graph.flush()]
        self._check_plugins()
        return out

    def _check_plugins(self) -> None:
        """A plug-in that misbehaved stopped its statement: stop the run with one error line naming both."""
        if self.graph.failures:
            name, _, reason = self.graph.take_failures()[0]
            fail(f"statement {name}: {reason}")

    def take_late(self) -> list[str]:
        return self.graph.take_late()

    def stats(self) -> dict[str, Any]:
        return {"statements": self.graph.stats(), "filtered": self.dropped}


def _graph_run(
    statements: list[tuple[Path, Any]], strategy: str | None, lateness_us: int, options: dict[str, Any]
) -> Any:
    from engine.detector import compile_statement, detector_for
    from engine.lql.errors import QueryError
    from engine.rules.graph import RuleGraph
    from engine.rules.index import RuleIndex

    def factory(statement: Any) -> Any:
        """What runs a statement here: :func:`engine.detector.detector_for` with ``lace match``'s options (a
        pattern's partial matches spill under its name); a statement that reads the archive cannot run here."""
        if statement.reads_archive:  # what its class declares
            raise TypeError("a live-and-archived statement needs the archive")
        return detector_for(statement, pm_query_id=statement.name, **options)

    graph = RuleGraph(factory=factory, allowed_lateness_us=lateness_us, router=RuleIndex())
    graph.report_derived = True
    for i, (path, tree) in enumerate(statements, 1):
        name = tree.name or f"statement_{i}"
        try:
            graph.add(name, compile_statement(tree, strategy=strategy))
        except QueryError as e:
            fail(f"{path}:{e.line}:{e.column}: {e.reason}")
        except TypeError:
            where = f"{path}:{tree.pos.line}:{tree.pos.column}"
            fail(f"{where}: a live-and-archived statement needs the archive: use `lace replay` or the service")
    return _GraphRun(graph)


def event_file_options(events: Path, schema: Path | None, lateness: str) -> tuple[dict[str, str] | None, int]:
    """The checked ``--events``, ``--schema`` and ``--lateness`` of ``lace match`` and ``lace stream``: the column
    types of ``--schema`` (None without one) and the lateness in int microseconds; a missing file or a bad value
    ends the command with its error (:func:`cli.app.fail`)."""
    if not events.is_file():
        fail(f"{events}: no such file")
    column_types = load_schema_option(schema) if schema is not None else None
    try:
        return column_types, parse_duration_us(lateness)
    except ValueError as e:
        fail(f"--lateness: {e}")


def load_schema_option(path: Path) -> dict[str, str]:
    """The column types of a ``--schema`` file (:func:`engine.event_files.load_schema`).

    Parameters
    ----------
    path : Path
        The JSON file, ``{"attribute": "string|int|float|bool|timestamp", ...}``.

    Returns
    -------
    dict[str, str]
        Attribute -> its type; a missing or bad file ends the command with its error (:func:`cli.app.fail`).
    """
    from engine.event_files import load_schema

    try:
        return load_schema(path)
    except (ValueError, OSError) as e:
        fail(f"--schema: {e}")


def _open_out_binary(out: Path | None) -> BinaryIO:
    if out is None:
        return sys.stdout.buffer
    try:
        return open(out, "wb")
    except OSError as e:
        fail(f"{out}: {e.strerror or e}")


def _run_match(
    matcher: Any,
    events: Path,
    ts_unit: TsUnitChoice,
    sort: bool,
    out: Path | None,
    stats: bool,
    fmt: str = "jsonl",
    column_types: dict[str, str] | None = None,
) -> None:
    from engine.match_files import MatchWriter
    from engine.matcher import LateEventError, Matcher, push_events
    from engine.plugins.api import PluginError
    from engine.rules.graph import DerivedInputError

    if fmt == "parquet" and out is None:
        fail("--format parquet needs --out FILE")
    n_events = n_late = n_matches = 0
    at_end: dict[str, Any] = {}
    start = time.perf_counter()
    sink = None
    thresholds = gc.get_threshold()

    def late(at: int, reason: object) -> None:
        """Count a late event (row ``at`` of the file) and report the first MAX_LATE_REPORTS."""
        nonlocal n_late
        n_late += 1
        if n_late <= MAX_LATE_REPORTS:
            warn(f"{events} {source.where(at)}: {reason}")

    try:
        source = open_event_file(events, ts_unit=ts_unit.value, schema=column_types)
        for message in source.warnings():
            warn(message)
        if sort:
            source.sort()
        gc.freeze()  # modules and the file's columns live to the end: keep them out of every collection
        # young collections every MATCH_GC_THRESHOLD allocations, not 700: the matching loop allocates nodes, matches
        # and event batches at a high rate and holds few cycles (P1-any, 6 interleaved runs each: 0.06 CPU s less at
        # 100,000; at 1,000,000 its 13 young and 1 older collections, 0.06 CPU s collecting nothing, are gone too)
        gc.set_threshold(MATCH_GC_THRESHOLD, *thresholds[1:])
        sink = MatchWriter(_open_out_binary(out), fmt)  # type: ignore[arg-type]
        push, write = matcher.push, sink.write
        take_late = getattr(matcher, "take_late", None)
        native = isinstance(matcher, Matcher)  # one live pattern query: the compiled driver loop (push_events)
        for batch in source.batches():
            if native:  # to the end of the batch, stopping at each late event to report it
                pos, error = push_events(matcher, write, batch, 0)
                while error is not None:
                    late(n_events + pos, error)
                    pos, error = push_events(matcher, write, batch, pos + 1)
            else:  # a rule graph's run
                for i, event in enumerate(batch, n_events):
                    try:
                        found = push(event)
                    except LateEventError as e:
                        late(i, e)
                        continue
                    except DerivedInputError as e:  # EMIT INTO a type the file holds: one line, no traceback
                        fail(f"{events} {source.where(i)}: {e}")
                    if found:
                        write(found)
                    if take_late is not None:
                        for reason in take_late():
                            late(i, reason)
            n_events += len(batch)
        at_end = matcher.stats() if stats else {}  # before the end of the stream drops every key's state
        write(matcher.flush())
        sink.flush()
        n_matches = sink.written
    except EventFileError as e:
        fail(str(e))
    except PluginError as e:  # a plug-in the query names misbehaved: one line, no traceback
        fail(str(e))
    except OSError as e:
        if isinstance(e, BrokenPipeError):
            silence_stdout()
            raise typer.Exit(0) from None  # the reader (e.g. `head`) has enough
        fail(f"{getattr(e, 'filename', None) or events}: {e.strerror or e}")
    finally:
        gc.set_threshold(*thresholds)
        if sink is not None and out is not None:
            sink.close()
    elapsed_s = time.perf_counter() - start

    if n_late > MAX_LATE_REPORTS:
        warn(f"{n_late - MAX_LATE_REPORTS} more late events rejected ({n_late} in all)")
    if stats:
        counters: dict[str, Any] = {"events": n_events, "late": n_late, "matches": n_matches}
        counters.update(rest_names(matcher.stats(), at_end))
        counters.update(
            elapsed_s=round(elapsed_s, 6),
            events_per_s=round(n_events / elapsed_s, 1) if elapsed_s > 0 else 0.0,
        )
        typer.echo(json.dumps(counters), err=True)


# what the REST API's query stats (service.statement.stats, QueryStats) call a matcher's counters
REST_NAMES = {
    "emitted": "matches",
    "live_partial_matches": "partial_matches",
    "peak_live": "peak_partial_matches",
    "spilled_now": "partial_matches_spilled",
    "spilled": "spills",
    "reloaded": "reloads",
}
# counters of what a detector holds now; the end of the stream empties them all, so --stats reads them before
GAUGES = frozenset(
    {"keys", "live_partial_matches", "buffered", "pending", "spilled_now", "open_runs", "open_windows", "groups"}
)


def rest_names(after: dict[str, Any], at_end: dict[str, Any]) -> dict[str, Any]:
    """The counters of ``lace match --stats``: each once, under the name the REST API's query stats give it.

    Parameters
    ----------
    after : dict
        A detector's (or a rule graph run's) ``stats()`` after the end of the stream.
    at_end : dict
        Its ``stats()`` at the end of the file, before the end of the stream: what it holds then (``keys``,
        ``partial_matches``, ``buffered``, ``pending``, ...; the end of the stream drops all of it) is read here.

    Returns
    -------
    dict
        ``after`` without what the caller counts itself (``events``, ``late``: the file's events and the late
        ones among them; ``emitted``: ``matches``, what was written) and without ``live`` (the same count as
        ``live_partial_matches``); the gauges from ``at_end``; nested dicts (a rule graph's statements) the same
        way, where ``results`` is the statement's ``matches``.

    Examples
    --------
    >>> rest_names({"events": 4, "emitted": 1, "live": 0, "live_partial_matches": 0, "keys": 0, "peak_live": 3},
    ...            {"live_partial_matches": 2, "keys": 2})
    {'partial_matches': 2, 'keys': 2, 'peak_partial_matches': 3}
    """
    return _renamed(after, at_end, top=True)


def _renamed(after: dict[str, Any], at_end: dict[str, Any], *, top: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in after.items():
        counted_here = top and name in ("events", "late", "emitted")
        if name == "live" or counted_here or (name == "emitted" and "results" in after):
            continue
        if isinstance(value, dict):
            value = _renamed(value, at_end.get(name) or {}, top=False)
        elif name in GAUGES and name in at_end:
            value = at_end[name]
        out["matches" if name == "results" else REST_NAMES.get(name, name)] = value
    return out
