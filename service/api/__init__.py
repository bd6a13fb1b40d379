"""The REST API: ``routes/<resource>.py`` and the typed dependencies of ``deps.py``."""
