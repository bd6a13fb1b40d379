"""The service database: SQLAlchemy 2 models, sessions, migrations (Alembic, in ``migrations/``)."""
