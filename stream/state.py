"""One partition key's detector state as bytes, for a ``ValueState`` of Spark's state store.

The engine's :class:`~engine.matcher.Matcher` cannot be pickled whole: its compiled plans hold closures (the
WHERE conditions, RETURN getters). Its per-key state can: runs, chains, pending trailing-negation matches and
the reorder buffer reference the plans only by identity. :func:`dump` pickles the matcher's mutable attributes
with each plan replaced by a persistent id (its index in ``matcher.plans``); :func:`load` puts them into a fresh
matcher of the same compiled query, whose plans take those ids. Nothing of the engine changes: the matcher that
runs one key here is the same class, with the same code path, as the one ``lace match`` runs for every key.
"""
from __future__ import annotations

import io
import pickle
from typing import Any

from engine.matcher import Matcher

_SAVED = (
    "states", "max_seen", "watermark", "last_released", "buffer", "pending", "_seq", "_last_key", "_next_sweep",
    "_intervals",
)
"""The matcher's attributes that change as it runs (everything else is built from the compiled query)."""


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, matcher: Matcher) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._plans = {id(p): i for i, p in enumerate(matcher.plans)}

    def persistent_id(self, obj: Any) -> Any:  # noqa: D102 - pickle's hook
        i = self._plans.get(id(obj))
        return None if i is None else i


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, matcher: Matcher) -> None:
        super().__init__(file)
        self._plans = matcher.plans

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102 - pickle's hook
        return self._plans[pid]


def dump(matcher: Matcher) -> bytes:
    """The matcher's run state (partial matches, pending matches, buffered events, event time, counters) as bytes.

    Raises
    ------
    pickle.PicklingError
        When the state holds something that is neither picklable nor one of the matcher's plans.
    """
    f = io.BytesIO()
    counters = matcher.counters.as_dict()
    _Pickler(f, matcher).dump(({name: getattr(matcher, name) for name in _SAVED}, counters))
    return f.getvalue()


def load(matcher: Matcher, data: bytes) -> Matcher:
    """Put the state :func:`dump` made into ``matcher`` (fresh, of the same compiled query); returns it."""
    saved, counters = _Unpickler(io.BytesIO(data), matcher).load()
    for name, value in saved.items():
        setattr(matcher, name, value)
    for name, value in counters.items():
        if hasattr(matcher.counters, name):
            setattr(matcher.counters, name, value)
    return matcher


def is_idle(matcher: Matcher) -> bool:
    """Whether the matcher holds nothing that a later event or the watermark could still complete or release."""
    return not matcher.states and not matcher.buffer and not matcher.pending
