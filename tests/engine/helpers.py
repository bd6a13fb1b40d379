"""Tiny hand-made streams and one-line query runs for the feature tests of the matcher.

A stream spec is a whitespace-separated list of events ``<type><id>[@<ts>][{attr=value,...}]``:

- ``a1``: an event of type ``A`` (the letters, upper-cased) with id 1 at ts = id seconds;
- ``b4@2``: type ``B``, id 4, at 2 s; ``b4@2.5`` at 2.5 s; ``b4@2000001us`` at 2,000,001 us;
- ``a1{p=10,k=x,s='x y',f=1.5,ok=true}``: attributes (int, float, bool, quoted or bare string).

A match is written ``"a=1 b=2,3 c=4"``: variable = ids of its events, variables in alphabetical
order, variables with no event left out (the same identity as :meth:`engine.match.Match.key`).

>>> [(e.type, e.id, e.ts, e.attrs) for e in stream("a1 b2@0.5{p=3,k=x}")]
[('A', 1, 1000000, {}), ('B', 2, 500000, {'p': 3, 'k': 'x'})]
>>> found("PATTERN SEQ(A a, B+ b[], C c)", "a1 b2 b3 c4 c5")
['a=1 b=2 c=4', 'a=1 b=2 c=5', 'a=1 b=2,3 c=4', 'a=1 b=2,3 c=5', 'a=1 b=3 c=4', 'a=1 b=3 c=5']
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest

from engine.compiler import compile_query
from engine.events import MICROS_PER_S, Event
from engine.match import Match
from engine.matcher import Matcher

STORAGES = ("chain", "runs")
both_storages = pytest.mark.parametrize("storage", STORAGES)
"""Decorator: run the test once per partial-match storage (they only differ for skip_till_any_match)."""

S = MICROS_PER_S

_EVENT = re.compile(r"([A-Za-z_]+)(\d+)(?:@(-?[\d.]+)(us)?)?(?:\{([^}]*)\})?")


def _value(text: str) -> Any:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text in ("true", "false"):
        return text == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def stream(spec: str) -> list[Event]:
    """The events of ``spec`` (see the module docstring), in the written order."""
    events = []
    pos = 0
    for m in _EVENT.finditer(spec):
        gap = spec[pos : m.start()]
        assert not gap.strip(), f"cannot read {gap.strip()!r} in the stream spec"
        pos = m.end()
        letters, num, ts, us, attrs = m.groups()
        eid = int(num)
        if ts is None:
            ts_us = eid * S
        elif us:
            ts_us = int(ts)
        else:
            ts_us = round(float(ts) * S)
        parsed = {}
        if attrs:
            for item in attrs.split(","):
                name, _, value = item.partition("=")
                parsed[name.strip()] = _value(value)
        events.append(Event(eid, letters.upper(), ts_us, parsed))
    assert not spec[pos:].strip(), f"cannot read {spec[pos:].strip()!r} in the stream spec"
    return events


def matcher(query: str, *, storage: str = "chain", strategy: str | None = None, lateness: Any = 0) -> Matcher:
    """A fresh :class:`Matcher` for LQL text."""
    return Matcher(compile_query(query, strategy=strategy), storage=storage, allowed_lateness_us=lateness)  # type: ignore[arg-type]


def run(
    query: str,
    events: str | Iterable[Event],
    *,
    storage: str = "chain",
    strategy: str | None = None,
    lateness: Any = 0,
    flush: bool = True,
) -> list[Match]:
    """Push every event (a spec or events), then flush (unless ``flush=False``); all matches in output order."""
    m = matcher(query, storage=storage, strategy=strategy, lateness=lateness)
    out: list[Match] = []
    for e in stream(events) if isinstance(events, str) else events:
        out += m.push(e)
    if flush:
        out += m.flush()
    return out


def label(match: Match | Mapping[str, Sequence[int]]) -> str:
    """``"a=1 b=2,3"`` for a match (or a ``Match.ids()`` dict); variables without events left out."""
    ids = match.ids() if isinstance(match, Match) else match
    return " ".join(f"{var}={','.join(map(str, ids[var]))}" for var in sorted(ids) if ids[var])


def labels(matches: Iterable[Match]) -> list[str]:
    """Sorted labels of ``matches``; duplicates stay, so a match reported twice shows twice."""
    return sorted(label(m) for m in matches)


def found(query: str, events: str | Iterable[Event], **kw: Any) -> list[str]:
    """``labels(run(query, events, **kw))``."""
    return labels(run(query, events, **kw))


def expected(*matches: str) -> list[str]:
    """Normalise hand-written labels (any variable order) to the sorted form :func:`found` returns."""
    out = []
    for text in matches:
        ids = {}
        for part in text.split():
            var, _, nums = part.partition("=")
            ids[var] = [int(n) for n in nums.split(",")]
        out.append(label(ids))
    return sorted(out)
