"""Pydantic models of the REST API, per resource: ``<Thing>Create`` / ``<Thing>Update`` / ``<Thing>Public``."""
