"""The LACE service: REST API, persistence, webhooks, ingest and the ``lace`` command line.

See docs/architecture.md section 7.10.
"""
