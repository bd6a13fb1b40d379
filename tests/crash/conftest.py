"""The crash suite runs on both databases: the service tests' ``database_kind`` fixture."""
from tests.service.conftest import database_kind  # noqa: F401 (a fixture, used by name)
