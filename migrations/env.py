"""Alembic environment: the service models' metadata, ``compare_type=True``, batch mode on SQLite.

The URL comes from the config (``service.db.migrate``), else from the service settings
(``LACE_DATABASE_URL``), so ``alembic -c alembic.ini revision --autogenerate`` works too.
"""
from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

import service.db.pm_models  # noqa: F401  (registers the partial-match table)
from service.db.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from service.core.config import get_settings

    return get_settings().sqlalchemy_url


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",
    )


def run_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, compare_type=True, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    from service.db.session import make_engine

    engine = make_engine(_url())
    try:
        with engine.connect() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
