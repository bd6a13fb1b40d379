"""Layered rules (003; docs/architecture.md section 7.9): filter rules, derived streams (``EMIT INTO``), windowed
continuous queries, and the rule graph that runs several statements over one stream."""
