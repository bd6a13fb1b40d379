"""Alembic migrations of the service database (``lace db upgrade``)."""
