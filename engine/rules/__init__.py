"""Layered rules (003; DESIGN.md section 9): filter rules, derived streams (``EMIT INTO``), windowed
continuous queries, and the rule graph that runs several statements over one stream."""
