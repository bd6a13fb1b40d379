"""Plug-ins: scalar functions, aggregates and operators from entry points (issue 16); see registry.py."""
