"""Archive statistics for OLLAA (docs/architecture.md section 7.7; 001 section 4.3).

* :meth:`ArchiveStats.counts`: events per type and key over a union of ranges (one
  Spark job).
* :meth:`ArchiveStats.pass_estimates`: pass probability of each WHERE conjunct of a live
  query, measured over archived events (EXPLAIN with events, ``engine.nfa.explain``): the
  ``estimates`` that seed the query's conjunct order (004, Strategy 1) before it sees a live event.
* :meth:`ArchiveStats.selectivity`: ``Sel_P = N_P / |S|`` of an archived pattern,
  estimated by running the engine's matcher over a sample of the archive. The sample
  is a random subset of keys when the pattern is partitioned by the types' key (a
  pattern instance never spans keys, so a key sample keeps instances whole), else
  the whole range.

Both read a pinned snapshot and are cached per snapshot version: the archive only
changes by new versions, so a cached answer is exact for its versions.
"""
from __future__ import annotations

import random
import threading
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from archive.extractor import Extractor
from archive.ranges import Range, make_request
from archive.schema import output_to_events
from engine.compiler import CompiledQuery, compile_query
from engine.matcher import Matcher

ALL_TIME: tuple[Range, ...] = ((-(1 << 62), 1 << 62),)
COUNTS_SCHEMA = pa.schema([("type", pa.string()), ("key", pa.string()), ("events", pa.int64())])


@dataclass(frozen=True, slots=True)
class Selectivity:
    """A sampled selectivity estimate.

    Attributes
    ----------
    value : float
        ``matches / events`` over the sample (0.0 for an empty sample).
    matches, events : int
        Pattern instances found and events matched over, in the sample.
    keys_sampled, keys_total : int
        Keys in the sample and in the range (equal when the whole range was used).
    versions : dict[str, int]
        The snapshot the estimate is exact for.
    """

    value: float
    matches: int
    events: int
    keys_sampled: int
    keys_total: int
    versions: dict[str, int] = field(default_factory=dict)


class ArchiveStats:
    """Counts and selectivities over an :class:`~archive.extractor.Extractor`'s archive, cached per snapshot."""

    def __init__(self, extractor: Extractor, *, cache_size: int = 256) -> None:
        self.extractor = extractor
        self.cache_size = cache_size
        self._cache: dict[Hashable, object] = {}
        self._lock = threading.Lock()
        self.hits = 0

    def _cached(self, key: Hashable) -> object | None:
        with self._lock:
            hit = self._cache.get(key)
            self.hits += hit is not None
            return hit

    def _store(self, key: Hashable, value: object) -> None:
        with self._lock:
            if len(self._cache) >= self.cache_size:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = value

    def counts(
        self,
        types: str | Iterable[str],
        *,
        ranges: Sequence[Range] = ALL_TIME,
        keys: Iterable[Hashable] | None = None,
        version: int | dict[str, int] | None = None,
    ) -> pa.Table:
        """Archived events per ``(type, key)`` with ts in ``ranges`` (int us, half-open).

        Returns
        -------
        pyarrow.Table
            ``type``, ``key`` (as string; null for types without a key), ``events``,
            sorted by type then key.
        """
        names = [types] if isinstance(types, str) else list(dict.fromkeys(types))
        pins = self.extractor.reader.pin(names, version)
        request = make_request(keys, ranges)
        cache_key = ("counts", tuple(names), tuple(sorted(pins.items())), repr(request))
        hit = self._cached(cache_key)
        if isinstance(hit, pa.Table):
            return hit
        etypes = list(self.extractor.reader.types(names).values())
        with self.extractor.frame(etypes, request, version=pins, with_key=True) as df:
            if df is None:
                table = COUNTS_SCHEMA.empty_table()
            else:
                counted = df.groupBy("type", "__key").count()
                table = counted.selectExpr("type", "__key AS key", "count AS events").toArrow().cast(COUNTS_SCHEMA)
                table = table.sort_by([("type", "ascending"), ("key", "ascending")])
        self._store(cache_key, table)
        return table

    def pass_estimates(
        self,
        query: str,
        *,
        ranges: Sequence[Range] = ALL_TIME,
        version: int | dict[str, int] | None = None,
    ) -> dict[str, float]:
        """Pass probability per WHERE conjunct of the live query ``query`` (LQL text), keyed by its normalized
        text, measured over the archived events of its types in ``ranges`` (int us, half-open).

        ``compile_query(query, estimates=stats.pass_estimates(query))`` then orders each NFA edge by them from
        the first live event (004, Strategy 1). Runs EXPLAIN with events (:mod:`engine.nfa.explain`) over the
        whole range (no key sample): give a short range. Cached per snapshot version.
        """
        from engine.nfa.explain import explain, measured_estimates

        compiled = compile_query(query)
        names = sorted(compiled.types)
        pins = self.extractor.reader.pin(names, version)
        cache_key = ("pass", query, tuple(ranges), tuple(sorted(pins.items())))
        hit = self._cached(cache_key)
        if isinstance(hit, dict):
            return hit
        table = self.extractor.extract(names, None, ranges, version=pins, include_recent=False)
        result = measured_estimates(explain(compiled, events=list(output_to_events(table))))
        self._store(cache_key, result)
        return result

    def selectivity(
        self,
        query: str | CompiledQuery,
        *,
        ranges: Sequence[Range] = ALL_TIME,
        sample_keys: int = 50,
        seed: int = 0,
        version: int | dict[str, int] | None = None,
    ) -> Selectivity:
        """Estimate ``Sel_P`` of the pattern ``query`` over the archived events in ``ranges``.

        Parameters
        ----------
        query : str | CompiledQuery
            A live-only pattern (LQL text or compiled), matched as archived pattern ``P_A``.
        sample_keys : int
            Keys drawn (without replacement, seeded) when the pattern is partitioned by
            the key of its types.
        """
        compiled = compile_query(query) if isinstance(query, str) else query
        names = sorted(compiled.types)
        etypes = self.extractor.reader.types(names)
        pins = self.extractor.reader.pin(names, version)
        query_id = query if isinstance(query, str) else repr(compiled.ast)
        cache_key = ("sel", query_id, tuple(ranges), sample_keys, seed, tuple(sorted(pins.items())))
        hit = self._cached(cache_key)
        if isinstance(hit, Selectivity):
            return hit
        key_attrs = {t.partition_key for t in etypes.values()}
        by_key = len(key_attrs) == 1 and None not in key_attrs and compiled.partition_by == tuple(key_attrs)
        sample: list[Hashable] | None = None
        total = sampled = 0
        if by_key:
            counts = self.counts(names, ranges=ranges, version=pins)
            all_keys: list[str] = sorted({k for k in counts.column("key").to_pylist() if k is not None})
            total = len(all_keys)
            drawn = random.Random(seed).sample(all_keys, min(sample_keys, total))
            sampled = len(drawn)
            key_kind = next(iter(etypes.values())).attributes[next(iter(key_attrs))]  # type: ignore[index]
            sample = [_from_string(k, key_kind) for k in drawn]
        table = self.extractor.extract(names, sample, ranges, version=pins, include_recent=False)
        matcher = Matcher(compiled)
        matches = 0
        for event in output_to_events(table):
            matches += len(matcher.push(event))
        matches += len(matcher.flush())
        n = table.num_rows
        result = Selectivity(matches / n if n else 0.0, matches, n, sampled, total, dict(pins))
        self._store(cache_key, result)
        return result


def _from_string(value: str, kind: str) -> Hashable:
    if kind == "int":
        return int(value)
    if kind == "float":
        return float(value)
    if kind == "bool":
        return value.lower() == "true"
    return value
