"""``lace operators``: list the installed plug-ins (functions, aggregates, operators) and their packages."""
from __future__ import annotations

import json
from typing import Annotated

import typer

from cli.app import app


@app.command()
def operators(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per plug-in, one per line.")] = False,
) -> None:
    """List the functions, aggregates and operators LQL can name, with the package that registered each.

    They come from the entry point groups lace.functions, lace.aggregates and lace.operators (LACE's
    built-ins included). A broken plug-in is listed with its error.
    """
    from engine.plugins.registry import catalog

    items = catalog()
    if as_json:
        for item in items:
            typer.echo(json.dumps(item))
        return
    kind = None
    for item in items:
        if item["kind"] != kind:
            kind = item["kind"]
            typer.echo(f"{'' if kind == 'function' else chr(10)}{kind}s:")
        extra = ""
        if item["cost"] is not None:
            extra = f" [cost {item['cost']:g}, pass estimate {item['pass_estimate']:g}]"
        typer.echo(f"  {item['signature'] or item['name']}  ({item['source']}){extra}")
        if item["error"]:
            typer.echo(f"      BROKEN: {item['error']}")
        elif item["doc"]:
            typer.echo(f"      {item['doc']}")
