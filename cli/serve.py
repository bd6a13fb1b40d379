"""``lace serve``, ``lace db upgrade`` and ``lace keys``: run and administer the REST service.

See docs/architecture.md section 7.10.
"""
from __future__ import annotations

from typing import Annotated, Any

import typer

from cli.app import Scope, app, fail


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default LACE_HOST, 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default LACE_PORT, 8000).")] = None,
    migrate: Annotated[bool, typer.Option(help="Run the database migrations first.")] = True,
) -> None:
    """Start the REST service (uvicorn); settings from LACE_* variables (docs/operations.md)."""
    import uvicorn

    from service.app import create_app

    settings = _settings()
    _check_archive_reads()
    typer.echo(f"lace serve: database {database_label(settings.sqlalchemy_url)}", err=True)
    if migrate:
        _upgrade(settings.sqlalchemy_url)
    uvicorn.run(
        create_app(settings),
        host=host or settings.host,
        port=settings.port if port is None else port,
        log_level=settings.log_level,
        log_config=_log_config(settings.log_level),
        access_log=settings.access_log,
    )


def _log_config(level: str) -> dict[str, Any]:
    """uvicorn's logging configuration with LACE's own loggers (``lace.*``) on the same handler and format."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["lace"] = {"handlers": ["default"], "level": level.upper(), "propagate": False}
    return config


db_app = typer.Typer(help="The service database.", no_args_is_help=True)
keys_app = typer.Typer(help="API keys.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(keys_app, name="keys")


def _settings() -> Any:
    from pydantic import ValidationError

    from service.core.config import Settings

    try:
        return Settings()
    except ValidationError as e:
        problems = "; ".join(f"LACE_{'_'.join(map(str, err['loc'])).upper()}: {err['msg']}" for err in e.errors())
        fail(f"bad settings: {problems}")


def _check_archive_reads() -> None:
    """Fail (one line, no traceback) on a bad ``LACE_ARCHIVE_LOCAL_READ_MB`` or ``LACE_ARCHIVE_CACHE_MB``: the archive
    reads them from the environment when the first live-and-archived request comes, which is too late to say so."""
    from archive.decoded_files import cache_bytes_from_env
    from archive.extractor import local_read_bytes_from_env

    try:
        local_read_bytes_from_env()
        cache_bytes_from_env()
    except ValueError as e:
        fail(f"bad settings: {e}")


def database_label(url: str) -> str:
    """The database of SQLAlchemy ``url`` as a user can find it: a SQLite file's absolute path, otherwise the URL
    without its password (``lace keys create`` and ``lace serve`` must name the same one).

    >>> database_label("postgresql+psycopg://u:pw@db:5432/lace")
    'postgresql+psycopg://u:***@db:5432/lace'
    """
    from pathlib import Path

    from sqlalchemy.engine import make_url

    u = make_url(url)
    if u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:":
        return f"sqlite file {Path(u.database).resolve()}"
    return u.render_as_string(hide_password=True)


def _upgrade(url: str) -> None:
    from service.db.migrate import upgrade

    try:
        upgrade(url)
    except Exception as e:  # a bad URL or an unreachable server: one line, no traceback
        fail(f"database migration failed ({url.split('@')[-1]}): {type(e).__name__}: {e}")


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Migrate the database (LACE_DATABASE_URL) to the newest revision."""
    from service.db.migrate import current

    settings = _settings()
    _upgrade(settings.sqlalchemy_url)
    typer.echo(f"database at revision {current(settings.sqlalchemy_url)}")


@keys_app.command("create")
def keys_create(
    scope: Annotated[list[Scope], typer.Option("--scope", "-s", help="admin, ingest or read; repeat for several.")],
    name: Annotated[str, typer.Option(help="A label for the key.")] = "cli",
) -> None:
    """Create an API key and print it once (only its SHA-256 is stored); the database it was written to goes to
    stderr (a service reading another database answers the key 401)."""
    from service.api_key import create_key
    from service.db.session import make_engine, make_session_factory

    settings = _settings()
    _upgrade(settings.sqlalchemy_url)
    engine = make_engine(settings.sqlalchemy_url)
    try:
        with make_session_factory(engine)() as session:
            _, token = create_key(session, name=name, scopes=[s.value for s in scope])
    finally:
        engine.dispose()
    typer.echo(token)
    typer.echo(f"key {name!r} written to the database {database_label(settings.sqlalchemy_url)}", err=True)


@keys_app.command("list")
def keys_list() -> None:
    """List API keys (id, prefix, scopes, name, revoked)."""
    from sqlalchemy import select

    from service.db.models import ApiKeyRow
    from service.db.session import make_engine, make_session_factory

    settings = _settings()
    engine = make_engine(settings.sqlalchemy_url)
    try:
        with make_session_factory(engine)() as session:
            for row in session.scalars(select(ApiKeyRow).order_by(ApiKeyRow.id)):
                state = "revoked" if row.revoked_at_us else "active"
                typer.echo(f"{row.id}\t{row.prefix}...\t{','.join(row.scopes)}\t{row.name}\t{state}")
    finally:
        engine.dispose()


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[int, typer.Argument(help="The key's id (see `lace keys list`).", min=1)]) -> None:
    """Revoke an API key: requests with it get 401 from now on (the row stays, marked revoked)."""
    from service.db.models import ApiKeyRow
    from service.db.session import make_engine, make_session_factory, now_us

    settings = _settings()
    _upgrade(settings.sqlalchemy_url)
    engine = make_engine(settings.sqlalchemy_url)
    try:
        with make_session_factory(engine)() as session:
            row = session.get(ApiKeyRow, key_id)
            if row is None:
                fail(f"no API key with id {key_id} (see `lace keys list`)")
            if row.revoked_at_us is None:
                row.revoked_at_us = now_us()
                session.commit()
            typer.echo(f"key {key_id} ({row.prefix}...) revoked")
    finally:
        engine.dispose()
