"""Run the Alembic migrations in ``migrations/`` (``lace db upgrade``, and on ``lace serve`` start)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"
_REVISION = re.compile(r'^revision: str = "(\d+)"$', re.MULTILINE)


def head_revision() -> str:
    """The newest revision in ``migrations/versions`` (the revisions are numbered and form one line:
    ``tests/service/test_migrations.py`` checks it against Alembic's own head), read without importing Alembic."""
    found = [m[1] for f in (MIGRATIONS / "versions").glob("*.py") for m in _REVISION.finditer(f.read_text())]
    return max(found, key=int)


def alembic_config(url: str) -> Config:
    """An Alembic config pointing at ``migrations/`` and ``url`` (no alembic.ini needed)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["configure_logger"] = False
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision``. A database already at the head is left as it is without
    importing Alembic (0.2 s of each ``lace serve`` start's CPU)."""
    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError

    from service.db.session import make_engine

    engine = make_engine(url)
    try:
        if revision == "head":
            try:
                with engine.connect() as conn:
                    at = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
            except SQLAlchemyError:  # no such table yet: a fresh database
                at = []
            if at == [head_revision()]:
                return
        from alembic import command

        with engine.begin() as conn:
            cfg = alembic_config(url)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
    finally:
        engine.dispose()


def current(url: str) -> str | None:
    """The database's current revision (None before the first migration)."""
    from alembic.runtime.migration import MigrationContext

    from service.db.session import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
