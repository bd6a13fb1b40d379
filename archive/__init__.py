"""The Delta Lake archive (docs/architecture.md section 7.8).

Write path (no Spark): :mod:`archive.schema` (event type -> Arrow schema),
:mod:`archive.wal` (durable write-ahead log), :mod:`archive.buffer` (the recent
buffer, R_Buffer of 001 section 3.3), :mod:`archive.writer` (WAL -> buffer -> delta-rs
appends, exactly once across restarts), :mod:`archive.maintenance` (compact, vacuum,
checkpoint; CLI in :mod:`archive.cli`).

Read path (Spark): :mod:`archive.spark` (one warmed session per process),
:mod:`archive.reader` (``native`` and ``filelist`` backends, snapshot pins),
:mod:`archive.extractor` (one Spark job per archive request), :mod:`archive.stats`
(counts and sampled selectivity for OLLAA).

Importing this package imports neither Spark nor delta-rs; each module imports what it needs.
"""
