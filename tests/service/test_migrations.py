"""``lace db upgrade`` on SQLite and PostgreSQL: reaches head, and the models match the migrated schema."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from cli.service_process import PACKAGE_ROOT, Database
from service.db.migrate import MIGRATIONS, alembic_config
from service.db.models import Base

if importlib.util.find_spec("service.db.pm_models") is not None:
    importlib.import_module("service.db.pm_models")


def test_db_upgrade_reaches_head_and_matches_the_models(fresh_db: Database, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LACE_")}
    env.update(LACE_DATABASE_URL=fresh_db.url, LACE_DATA_DIR=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-m", "cli", "db", "upgrade"], env=env, cwd=PACKAGE_ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    head = ScriptDirectory.from_config(alembic_config(fresh_db.url)).get_current_head()
    assert out.stdout.strip() == f"database at revision {head}"
    engine = create_engine(fresh_db.url)
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            assert {
                "event_types",
                "queries",
                "webhooks",
                "alerts",
                "deliveries",
                "delivery_attempts",
                "api_keys",
            } <= tables
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    finally:
        engine.dispose()
    assert diff == [], diff
    assert MIGRATIONS.is_dir()


def test_the_head_read_without_alembic_is_alembics_head_and_an_upgrade_at_head_changes_nothing(
    fresh_db: Database,
) -> None:
    """``lace serve`` skips Alembic when the database is at :func:`head_revision` (read from the files): that must be
    Alembic's head, or a database one migration behind would start without it."""
    from service.db.migrate import current, head_revision, upgrade

    assert head_revision() == ScriptDirectory.from_config(alembic_config(fresh_db.url)).get_current_head()
    upgrade(fresh_db.url)  # a fresh database: Alembic runs every migration
    assert current(fresh_db.url) == head_revision()
    upgrade(fresh_db.url)  # at head: nothing to do
    assert current(fresh_db.url) == head_revision()
