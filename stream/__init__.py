"""LACE statements on Spark Structured Streaming (issue 26; docs/stream.md).

:mod:`stream.statements` says which statements run here; :mod:`stream.job` builds the streaming query (a Delta
source read by ``readStream``, ``transformWithStateInPandas`` keyed by PARTITION BY, a Delta results table);
:mod:`stream.archive_source` makes the archive's Delta events tables the source and ends a bounded run over them;
:mod:`stream.processor` is what Spark runs per key; :mod:`stream.state` turns a key's matcher state into the bytes
of its ``ValueState``. A live-and-archived statement (file mode) runs its live pattern there and joins each
micro-batch's live instances with the source table, its archive, by a Spark ``cogroup`` per archive key
(:func:`stream.job._archive_join`, :func:`stream.processor.join_group`).

State choice: ``transformWithStateInPandas`` offers value, list and map state of Spark SQL rows, while the
engine's partial matches are linked Python objects (runs, chains, shared groups) whose plans hold closures. Each
key's state is therefore one ``ValueState`` holding the key's matcher state pickled (plans by persistent id), in
the RocksDB state store; the engine itself is unchanged.
"""
