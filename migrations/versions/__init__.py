"""Alembic revisions (files named <rev>_<slug>.py)."""
