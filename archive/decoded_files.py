"""The archive's Parquet files kept decoded in memory (issue 43; docs/architecture.md section 7.8).

A live-and-archived query's small archive requests are read in the service process with Arrow
(:meth:`archive.reader.ArchiveReader.read_arrow`). Ten queries over one stream send about a thousand such
reads a minute, each over the same few days of files: decoding those files again for every read (dictionary
strings, Snappy, copies) was 40 % of the service's CPU in ``bench.service --live-archived --queries 10``.
A Delta data file never changes once written (its name is unique; compaction writes new files and removes
the old ones from the log), so its decoded rows can be kept and reused by every later read of any version
that still holds it.

:class:`DecodedFiles` keeps whole files, least recently used first out, within a byte budget
(``LACE_ARCHIVE_CACHE_MB``, default :data:`CACHE_MB`; 0 keeps nothing). A read selects its rows from the
kept files with two vectorized masks (the requested keys through each file's key dictionary, and the time
hull over the end column); the caller then filters exactly, as it did after a filtered scan.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

CACHE_MB = 256
"""Default budget of decoded archive files per process, in MiB."""


def cache_bytes_from_env(environ: Mapping[str, str] | None = None) -> int:
    """``LACE_ARCHIVE_CACHE_MB`` (default :data:`CACHE_MB`) in bytes; 0: no file is kept decoded.

    Raises
    ------
    ValueError
        When the value is not a number (the message names the setting).

    >>> cache_bytes_from_env({"LACE_ARCHIVE_CACHE_MB": "0.5"})
    524288
    """
    from archive.extractor import mib_bytes

    env = os.environ if environ is None else environ
    return mib_bytes("LACE_ARCHIVE_CACHE_MB", env.get("LACE_ARCHIVE_CACHE_MB", ""), CACHE_MB)


@dataclass(frozen=True, slots=True)
class DecodedFile:
    """One Parquet file's rows, decoded, with what selecting them needs.

    Attributes
    ----------
    table : pyarrow.Table
        Every row of the file, in the schema it was read with.
    ends : numpy.ndarray
        The end column (``ts_end`` of an interval type, else ``ts``) as int64 microseconds UTC.
    codes : numpy.ndarray, optional
        Per row, the position of its key in ``dictionary`` (int64; a null key: ``len(dictionary)``); None
        when the type has no key attribute.
    dictionary : pyarrow.Array, optional
        The file's distinct key values.
    nbytes : int
        What the entry holds in memory (table, ends and codes), counted against the budget.
    """

    table: pa.Table
    ends: np.ndarray
    codes: np.ndarray | None
    dictionary: pa.Array | None
    nbytes: int

    @classmethod
    def decode(cls, path: str, schema: pa.Schema, end: str, key: str | None) -> DecodedFile:
        """Read the whole file at ``path`` in ``schema`` (columns it lacks are nulls), the end column ``end``
        and key attribute ``key`` (None: none) indexed as above."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        table = ds.dataset([path], schema=schema, format="parquet").to_table()
        ends = pc.fill_null(table.column(end).cast(pa.int64()), np.iinfo(np.int64).min).to_numpy()
        codes = dictionary = None
        if key is not None:
            encoded = pc.dictionary_encode(table.column(key).combine_chunks())
            dictionary = encoded.dictionary
            codes = pc.fill_null(encoded.indices, len(dictionary)).to_numpy().astype(np.int64)
        nbytes = table.nbytes + ends.nbytes + (codes.nbytes if codes is not None else 0)
        return cls(table, ends, codes, dictionary, nbytes)

    def rows(self, span: tuple[int, int] | None, keys: pa.Array | None) -> np.ndarray:
        """Boolean mask of the rows whose end lies in ``span`` (``[lo, hi)`` us; None: any) and whose key is
        one of ``keys`` (typed like the key column; None: any key). A superset of a request's rows when
        ``span`` is its hull and ``keys`` its keys."""
        import pyarrow.compute as pc

        mask = np.ones(len(self.ends), dtype=bool)
        if span is not None:
            mask &= (self.ends >= span[0]) & (self.ends < span[1])
        if keys is not None and self.codes is not None and self.dictionary is not None:
            wanted = np.zeros(len(self.dictionary) + 1, dtype=bool)  # the last slot: a null key, never wanted
            wanted[:-1] = pc.is_in(self.dictionary, value_set=keys).to_numpy(zero_copy_only=False)
            mask &= wanted[self.codes]
        return mask


class DecodedFiles:
    """Decoded Parquet files by path, least recently used dropped beyond ``max_bytes`` (thread-safe).

    Parameters
    ----------
    max_bytes : int, optional
        The budget (:attr:`DecodedFile.nbytes` summed); a file larger than it is decoded for the read and not
        kept. Default: :func:`cache_bytes_from_env`.

    Attributes
    ----------
    hits, misses : int
        Files found decoded / decoded for a read, since start.
    """

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = cache_bytes_from_env() if max_bytes is None else max_bytes
        self._files: OrderedDict[tuple[str, pa.Schema, str, str | None], DecodedFile] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return self._bytes

    def get(self, path: str, schema: pa.Schema, end: str, key: str | None) -> DecodedFile:
        """The file at ``path`` decoded (see :meth:`DecodedFile.decode`), from memory when it was kept.

        The entry is per schema too: a type's schema evolution reads old files with the new columns null."""
        at = (path, schema, end, key)
        with self._lock:
            hit = self._files.get(at)
            if hit is not None:
                self._files.move_to_end(at)
                self.hits += 1
                return hit
            self.misses += 1
        decoded = DecodedFile.decode(path, schema, end, key)  # outside the lock: reads of other files go on
        if decoded.nbytes > self.max_bytes:
            return decoded
        with self._lock:
            old = self._files.pop(at, None)
            if old is not None:  # another read decoded it meanwhile
                self._bytes -= old.nbytes
            self._files[at] = decoded
            self._bytes += decoded.nbytes
            while self._bytes > self.max_bytes:
                _, dropped = self._files.popitem(last=False)
                self._bytes -= dropped.nbytes
        return decoded

    def select(
        self, paths: Sequence[str], schema: pa.Schema, end: str, key: str | None, span: tuple[int, int] | None,
        keys: Sequence[Hashable] | None,
    ) -> pa.Table:
        """The rows of the files ``paths`` (in this order, each in file order) whose end lies in ``span`` and whose
        key attribute ``key`` is one of ``keys`` (None: any), as one table in ``schema``: what a scan of the files
        filtered by the same conditions gives."""
        import pyarrow as pa

        typed = None if keys is None or key is None else pa.array(list(keys), type=schema.field(key).type)
        parts = []
        for path in paths:
            f = self.get(path, schema, end, key)
            mask = f.rows(span, typed)
            if mask.all():
                parts.append(f.table)
            elif mask.any():
                parts.append(f.table.filter(pa.array(mask)))
        return pa.concat_tables(parts) if parts else schema.empty_table()
