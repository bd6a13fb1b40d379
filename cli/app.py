"""The ``lace`` command line (docs/architecture.md section 7.12): the typer app and what its commands share.

One module per command registers itself on :data:`app` (``cli.match``, ``cli.explain``, ``cli.replay``, ``cli.demo``,
``cli.backfill``, ``cli.serve``); :mod:`cli.main` imports them all.

User errors (bad query, missing file, bad event row) print one ``error: ...`` line on
stderr and exit 2, never a traceback. Engine modules are imported inside the commands
that need them, so ``lace --help`` stays fast.
"""
from __future__ import annotations

import contextlib
import os
import sys
from enum import StrEnum
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, TextIO

import typer

from engine.durations import parse_duration_us
from engine.options import Algorithm, PmPolicy, Storage, Strategy

if TYPE_CHECKING:
    from rich.console import Console

app = typer.Typer(
    name="lace",
    help="LACE: live-and-archived complex event detection.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

USAGE_ERROR = 2
MAX_LATE_REPORTS = 10  # late events reported one by one; the rest only counted
_STUB = {"allow_extra_args": True, "ignore_unknown_options": True}
class Backend(StrEnum):
    """Where ``lace replay`` archives the stream: in memory, or in Delta read through Spark."""

    memory = "memory"
    spark = "spark"


class Scope(StrEnum):
    """API key scopes."""

    admin = "admin"
    ingest = "ingest"
    read = "read"


class TsUnitChoice(StrEnum):
    """Unit of numeric ts values in an event file (see ``engine.io.read_events``)."""

    auto = "auto"
    ms = "ms"
    s = "s"
    us = "us"


PmCapacityOption = Annotated[
    int | None, typer.Option(help="Keep at most N partial matches in memory; spill the rest.", min=1)
]
PmPolicyOption = Annotated[PmPolicy, typer.Option(help="Which partial matches to spill first.")]
PmStoreOption = Annotated[
    str | None, typer.Option(help="SQLAlchemy URL of the partial-match store (default: a temporary SQLite file).")
]
"""The partial-match budget options of ``lace match`` and ``lace replay`` (docs/architecture.md section 7.6)."""


LOG_WIDTH = 160
"""Columns of rich output that does not go to a terminal (a pipe, CI's log, a file): rich's default there is 80, which
cut the demo's summary table ("aler…", "21,2…"); a log is read whole, so lines may be wider."""


def console(*, stderr: bool = False) -> Console:
    """The rich console of a command: the terminal's width on a terminal, :data:`LOG_WIDTH` columns elsewhere (unless
    ``COLUMNS`` is set, which rich honours)."""
    from rich.console import Console

    out = Console(stderr=stderr)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = LOG_WIDTH
    return out


def fail(message: str, code: int = USAGE_ERROR) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def warn(message: str) -> None:
    """Print ``warning: message`` on stderr."""
    typer.echo(f"warning: {message}", err=True)


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        fail(f"{path}: no such file")
    except (OSError, UnicodeDecodeError) as e:
        fail(f"{path}: {getattr(e, 'strerror', None) or e}")


def _version(value: bool) -> None:
    if value:
        from engine.build import engine_build

        typer.echo(f"lace {metadata.version('lace')}, engine {engine_build()}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """LACE: live-and-archived complex event detection."""



def silence_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the interpreter's final flush does not complain."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def open_out(out: Path | None) -> TextIO:
    """``out`` opened for writing (UTF-8), or stdout when None; an error line and exit 2 when it cannot be."""
    if out is None:
        return sys.stdout
    try:
        return open(out, "w", encoding="utf-8")
    except OSError as e:
        fail(f"{out}: {e.strerror or e}")


__all__ = [
    "Algorithm", "Backend", "PmCapacityOption", "PmPolicy", "PmPolicyOption", "PmStoreOption", "Scope", "Storage",
    "Strategy", "TsUnitChoice", "USAGE_ERROR", "app", "fail", "open_out", "parse_duration_us", "read_text",
    "silence_stdout", "warn",
]
