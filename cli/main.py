"""``lace``: the command line's entry point; importing the command modules registers them on :data:`app`."""
from __future__ import annotations

from archive.cli import archive_app
from cli import backfill, demo, explain, match, operators, replay, serve, stream  # noqa: F401 - each registers its commands
from cli.app import app

app.add_typer(archive_app, name="archive")

__all__ = ["app"]

if __name__ == "__main__":
    app()
