"""The LACE service: REST API, persistence, webhooks, ingest and the ``lace`` command line (DESIGN.md section 10)."""
