"""``lace explain``: the plan of a live query, the cost model's estimates and, with ``--events``, measured counts.

See :mod:`engine.nfa.explain` for the model (004, formulas (5)-(10)) and docs/lql.md ("EXPLAIN").
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.app import Strategy, TsUnitChoice, app, fail, read_text, warn
from cli.match import load_schema_option
from engine.io import EventFileError, open_event_file


def _load_json_map(path: Path, what: str) -> dict[str, float]:
    try:
        doc = json.loads(read_text(path))
    except json.JSONDecodeError as e:
        fail(f"{path}: not JSON ({e.msg} at line {e.lineno} column {e.colno})")
    if not isinstance(doc, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in doc.items()
    ):
        fail(f"{path}: {what} must be a JSON object of numbers, e.g. {{\"t.size >= 10000\": 0.01}}")
    return {k: float(v) for k, v in doc.items()}


@app.command()
def explain(
    query_file: Annotated[
        Path | None,
        typer.Argument(metavar="[QUERY]", help="LQL query file (a live-only pattern query); or give it with --query."),
    ] = None,
    query_opt: Annotated[
        Path | None, typer.Option("--query", "-q", help="LQL query file, as lace match takes it.")
    ] = None,
    events: Annotated[
        Path | None,
        typer.Option("--events", "-e", help="Event file: run the query over it and show measured counts."),
    ] = None,
    estimates: Annotated[
        Path | None,
        typer.Option(help="JSON file: pass probability per conjunct text, e.g. {\"t.size >= 10000\": 0.0024}."),
    ] = None,
    rates: Annotated[
        Path | None, typer.Option(help="JSON file: events per second per type (without --events).")
    ] = None,
    keys: Annotated[int, typer.Option(help="Partition keys (without --events).", min=1)] = 1,
    strategy: Annotated[Strategy | None, typer.Option(help="Override the query's STRATEGY.")] = None,
    push_down: Annotated[
        bool, typer.Option("--push-down/--no-push-down", help="Push conjuncts down to the earliest edge.")
    ] = True,
    archive: Annotated[
        Path | None,
        typer.Option("--archive", "-a", help="Archive root: run the candidate plans over [--from, --to) on Spark."),
    ] = None,
    from_: Annotated[
        str | None, typer.Option("--from", help="With --archive: start (inclusive), ISO-8601 with offset or epoch ms.")
    ] = None,
    to: Annotated[
        str | None, typer.Option("--to", help="With --archive: end (exclusive), ISO-8601 with offset or epoch ms.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    ts_unit: Annotated[TsUnitChoice, typer.Option(help="Unit of numeric ts: auto = int ms, decimal s.")] = (
        TsUnitChoice.auto
    ),
    schema: Annotated[
        Path | None, typer.Option("--schema", help="With --events: JSON file of column types, as lace match takes it.")
    ] = None,
) -> None:
    """Show a live query's NFA plan: per node its conjuncts in evaluation order, the estimated input rate, pass
    probability and cost (004's formula 10), and with --events the counts measured over that file. With
    --archive/--from/--to (EXPLAIN ... USING ARCHIVE) the candidate plans run over that archive slice, read on
    Spark, and the plan shown is the one with the least measured CPU time."""
    if query_file is not None and query_opt is not None and query_file != query_opt:
        fail("give the query file once: positionally or with --query")
    query = query_opt or query_file
    if query is None:
        fail("a query file is needed: lace explain --query FILE (or lace explain FILE)")
    text = read_text(query)
    est = _load_json_map(estimates, "--estimates") if estimates is not None else None
    rate_map = _load_json_map(rates, "--rates") if rates is not None else None
    if events is not None and not events.is_file():
        fail(f"{events}: no such file")
    column_types = load_schema_option(schema) if schema is not None else None
    using = _archive_slice(archive, from_, to, events)

    from engine.compiler import compile_query
    from engine.lql.errors import QueryError
    from engine.nfa.explain import explain as explain_query

    try:
        compiled = compile_query(
            text, strategy=strategy.value if strategy else None, push_down=push_down, estimates=est
        )
    except QueryError as e:
        fail(f"{query}:{e.line}:{e.column}: {e.reason}")
    except ValueError as e:
        fail(str(e))
    sample = None
    if events is not None:
        try:
            source = open_event_file(events, ts_unit=ts_unit.value, schema=column_types)
            for message in source.warnings():
                warn(message)
            sample = [e for batch in source.batches() for e in batch]
        except EventFileError as e:
            fail(str(e))
        except OSError as e:
            fail(f"{events}: {e.strerror or e}")
    if using is not None:  # the chosen plan, its model fed with the slice's rates
        from engine.nfa.plan_trial import explain_chosen

        trial, chosen = _trial(compiled, *using)
        result = explain_chosen(chosen, trial)
    else:
        try:
            result = explain_query(compiled, events=sample, rates=rate_map, keys=keys)
        except ValueError as e:
            fail(str(e))
        result["trial"] = None
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        typer.echo(render(result))


def _archive_slice(
    archive: Path | None, from_: str | None, to: str | None, events: Path | None
) -> tuple[Path, int, int] | None:
    """(root, from us, to us) of ``--archive --from --to``, or None without ``--archive``."""
    if archive is None:
        if from_ is not None or to is not None:
            fail("--from and --to need --archive")
        return None
    if events is not None:
        fail("--archive and --events are alternatives: give one")
    if from_ is None or to is None:
        fail("--archive needs --from and --to (the slice [from, to) the candidate plans run over)")
    from cli.backfill import parse_range_us

    lo, hi = parse_range_us(from_, to)
    if not archive.is_dir():
        fail(f"{archive}: no such archive directory")
    return archive, lo, hi


def _trial(compiled: Any, root: Path, lo: int, hi: int) -> tuple[dict[str, Any], Any]:
    """Read the slice on Spark, run the candidate plans (:mod:`engine.nfa.plan_trial`), compile the winner:
    ``(trial, compiled)``."""
    import shutil

    if shutil.which("java") is None:
        fail("lace explain --archive needs Java 17 on PATH (Spark reads the archive)")
    from datetime import UTC, datetime

    from archive.archived_source import LazyArchiveSource
    from engine.nfa.plan_trial import choose_by_trial

    try:
        events = LazyArchiveSource(root).extract(sorted(compiled.types), None, [(lo, hi)])
    except Exception as e:  # noqa: BLE001 - Spark or Delta: the user's archive or setup, reported in one line
        fail(f"{root}: the archive could not be read ({type(e).__name__}: {e})")
    trial, chosen = choose_by_trial(compiled, events)  # compiled.ast carries --strategy
    trial.update({k: datetime.fromtimestamp(us / 1e6, UTC).isoformat() for k, us in (("from", lo), ("to", hi))})
    return trial, chosen


def _num(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "-"
    if abs(x) >= 1e6 or (x and abs(x) < 10 ** -digits):
        return f"{x:.3g}"
    return f"{x:.{digits}f}"


def render(result: dict[str, Any]) -> str:
    """The EXPLAIN result as indented text (one block per plan, one line per node and per conjunct)."""
    s = result["stream"]
    window = result["window_us"]
    lines = [
        f"EXPLAIN {result['name'] or '(unnamed)'}  strategy {result['strategy']}  plan {result['plan_kind']}  "
        f"window {'none' if window is None else f'{window / 1e6:g} s'}",
        "stream ({}): {}; {} key(s){}".format(
            s["source"],
            ", ".join(f"{t} {_num(r, 2)}/s" for t, r in s["rates"].items()),
            s["keys"],
            "" if s["duration_s"] is None else f"; {_num(s['duration_s'], 2)} s",
        ),
    ]
    trial = result.get("trial")
    if trial is not None:
        lines.append(
            f"plan trial over the archive [{trial['from']}, {trial['to']}): {trial['events']:,} events, "
            f"{trial['keys']} key(s); chosen: {trial['chosen']}"
        )
        for c in trial["candidates"]:
            tree = f" {c['tree']}" if c["tree"] else ""
            lines.append(
                f"  {'*' if c['name'] == trial['chosen'] else ' '} {c['name']:<13}{tree}  cpu {c['cpu_s']:.4f} s "
                f"(best of {c['runs']})  {_num(c['events_per_s'], 0)} ev/s  {c['matches']} matches"
            )
    if result["measured_matches"] is not None:
        lines.append(f"measured matches: {result['measured_matches']}")
    for plan in result["plans"]:
        path = " -> ".join(plan["components"])
        tree = f"   tree {plan['tree']}" if plan.get("tree") else ""
        lines.append(f"plan {plan['index']}: {path}{tree}   total cost {_num(plan['total_cost'])}/s")
        for n in plan["nodes"]:
            e = n["estimate"]
            head = (
                f"  node {n['slot']} {n['var']}{'[]' if n['kleene'] else ''} ({', '.join(n['types'])}): "
                f"est. input {_num(e['input_rate'])}/s  pass {_num(e['pass_probability'], 4)}  "
                f"cost/input {_num(e['cost_per_input'], 2)}  cost {_num(e['cost'])}/s"
            )
            if e["input"] is not None:
                head += f"  [est. over the events: in {_num(e['input'], 0)}, out {_num(e['output'], 0)}]"
            lines.append(head)
            m = n["measured"]
            if m is not None:
                lines.append(
                    f"      measured: in {m['input']}, out {m['output']}, pass {_num(m['pass_probability'], 4)}"
                )
            for k, c in enumerate(n["conjuncts"], 1):
                est = _num(c["pass_estimate"], 4)
                row = f"      {k}. {c['group']:<13} {c['text']}   cost {c['cost']}  est. p {est}"
                if c["measured_pass"] is not None:
                    row += f"  measured {_num(c['measured_pass'], 4)} of {c['evaluations']}"
                lines.append(row)
            if n["negations"]:
                lines.append(f"      negations: {', '.join(n['negations'])} (not in the model)")
    return "\n".join(lines)
