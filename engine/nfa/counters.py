"""Counters of a matcher run (reported by ``lace match --stats``)."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class Counters:
    """Engine counters.

    Attributes
    ----------
    events : int
        Events released to the NFA (in (ts, id) order).
    late : int
        Events rejected as late.
    ignored : int
        Events of types the query does not mention.
    created : int
        Partial matches created (chain storage: nodes; run storage: runs).
    copied : int
        Partial matches created by copying another (run storage branching; 0 for chains).
    merged : int
        Partial matches that joined another run's group instead of being advanced on their own
        (skip_till_next_match / contiguity with shared runs, :mod:`engine.nfa.shared_runs`).
    live : int
        Partial matches currently held.
    peak_live : int
        Largest ``live`` seen.
    emitted : int
        Matches emitted.
    pending : int
        Matches currently held for a trailing negation.
    """

    events: int = 0
    late: int = 0
    ignored: int = 0
    created: int = 0
    copied: int = 0
    merged: int = 0
    live: int = 0
    peak_live: int = 0
    emitted: int = 0
    pending: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
