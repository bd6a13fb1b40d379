"""``lace archive compact|vacuum|checkpoint``: archive maintenance from the command line.

Mounted by ``cli/main.py`` as ``app.add_typer(archive_app, name="archive")``. Each
command prints one JSON object on stdout; user errors print one ``error: ...`` line on
stderr and exit 2.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

# The same as archive.maintenance's defaults (a test checks): importing that module here would load pyarrow
# and delta-rs on every `lace` command, `lace --help` included.
DEFAULT_RETENTION_HOURS = 168
DEFAULT_LONGEST_QUERY_S = 3_600
DEFAULT_ROW_GROUP_ROWS = 16_384

archive_app = typer.Typer(
    name="archive", help="Maintain the Delta archive (compact, vacuum, checkpoint).", no_args_is_help=True
)

Root = Annotated[
    Path,
    typer.Option(
        "--root",
        envvar=["LACE_ARCHIVE_PATH", "LACE_ARCHIVE_ROOT"],
        help="Archive root directory (default LACE_ARCHIVE_PATH, the service's setting).",
    ),
]
Types = Annotated[list[str] | None, typer.Option("--type", "-t", help="Event type; repeat for several (default all).")]


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _run(fn: Any, root: Path, **kwargs: Any) -> None:
    if not root.is_dir():
        _fail(f"{root}: no archive there")
    try:
        result = fn(root, **kwargs)
    except ValueError as e:
        _fail(str(e))
    typer.echo(json.dumps(result))


@archive_app.command()
def compact(
    root: Root,
    type: Types = None,
    before: Annotated[str | None, typer.Option(help="First open day, YYYY-MM-DD (default today UTC).")] = None,
    z_order: Annotated[
        bool, typer.Option("--z-order/--no-z-order", help="Cluster each day by the type's key.")
    ] = False,
    target_size_kib: Annotated[int | None, typer.Option(help="Target file size, KiB (default delta-rs's).")] = None,
    row_group_rows: Annotated[
        int, typer.Option(help="Rows per Parquet row group (their statistics let key lookups skip the others).")
    ] = DEFAULT_ROW_GROUP_ROWS,
) -> None:
    """Compact the small files of closed days (days already compacted and unchanged are skipped)."""
    from archive.maintenance import compact as run

    target = None if target_size_kib is None else target_size_kib * 1024
    _run(run, root, types=type, before=before, z_order=z_order, target_size=target, row_group_rows=row_group_rows)


@archive_app.command()
def vacuum(
    root: Root,
    type: Types = None,
    retention_hours: Annotated[int, typer.Option(help="Keep removed files this many hours.")] = DEFAULT_RETENTION_HOURS,
    longest_query_s: Annotated[
        int, typer.Option(help="Longest archive request expected, seconds: shorter retentions are refused.")
    ] = DEFAULT_LONGEST_QUERY_S,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the files only.")] = False,
) -> None:
    """Delete files removed from the tables longer ago than the retention."""
    from archive.maintenance import vacuum as run

    _run(run, root, types=type, retention_hours=retention_hours, longest_query_s=longest_query_s, dry_run=dry_run)


@archive_app.command()
def checkpoint(
    root: Root,
    type: Types = None,
    cleanup: Annotated[bool, typer.Option(help="Also delete expired log files.")] = False,
) -> None:
    """Write a Delta log checkpoint of each table."""
    from archive.maintenance import checkpoint as run

    _run(run, root, types=type, cleanup=cleanup)
