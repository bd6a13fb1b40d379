"""Which partial matches to spill first: TPM and STPM (001_e24f905c15fdf08b.txt, sections 5.1, 5.2).

Both policies rank *units* of partial matches, the paper's ``PM_e`` entity of one object:
every partial match of one partition key (in one plan). The buffer asks for victims, lowest
priority first, and spills whole units.

- :class:`TPM` (temporal): units in order of creation of their oldest partial match (its
  first event's ts); the oldest is spilled first, however recently it was updated.
- :class:`STPM` (spatio-temporal, Definition 7 and Procedure 1): each state update of a unit at
  event time ``t`` in NFA state i inserts a record ``W = t + Δt_i · p(E_{i+1} | E_i)`` into a
  priority tree (``sortedcontainers.SortedList``); the lowest ``W`` is spilled first. Older
  records of the same unit become stale and are dropped when they reach the front (the
  paper's "compare the record's state with the partial match's latest state").
"""
from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterator
from typing import Protocol

from sortedcontainers import SortedList

Unit = Hashable
"""What the buffer spills as a whole: (plan, partition key) for :class:`engine.pm.buffer.PartialMatchBuffer`."""


class SpillPolicy(Protocol):
    """The interface both policies implement."""

    name: str

    def touch(self, unit: Unit, t_us: int, weight_us: float, created_us: int) -> None:
        """A unit got a new partial match (or a state update) at event time ``t_us``.

        ``weight_us`` is ``Δt_i · p(E_{i+1} | E_i)`` for the unit's NFA state (STPM uses it);
        ``created_us`` is when that partial match was created, the ts of its first event (TPM).
        """

    def victims(self) -> Iterator[Unit]:
        """Units to spill, lowest priority first; each unit at most once per call."""

    def forget(self, unit: Unit) -> None:
        """The unit left memory (spilled, expired or emptied)."""


class _Ranked:
    """A priority tree of units with lazily dropped stale records (shared by TPM and STPM)."""

    def __init__(self) -> None:
        self._tree: SortedList | None = None
        self._latest: dict[Unit, tuple[float, int]] = {}
        self._seq = itertools.count()

    def _set(self, unit: Unit, priority: float) -> None:
        version = next(self._seq)
        self._latest[unit] = (priority, version)
        if self._tree is not None:
            self._tree.add((priority, version, unit))

    def victims(self) -> Iterator[Unit]:
        if self._tree is None:
            self._tree = SortedList((w, v, u) for u, (w, v) in self._latest.items())
        tree = self._tree
        while tree:
            w, version, unit = tree.pop(0)
            latest = self._latest.get(unit)
            if latest is None or latest[1] != version:
                continue  # stale: the unit was updated (or left memory) after this record
            yield unit

    def forget(self, unit: Unit) -> None:
        self._latest.pop(unit, None)

    def __len__(self) -> int:
        return len(self._tree) if self._tree is not None else len(self._latest)


class TPM(_Ranked):
    """Temporal partial-match management (001, section 5.1): oldest partial matches first.

    A unit ranks by the creation time (first event ts, the paper's ``T_S``) of the oldest
    partial match it holds, however recently that partial match was updated.
    """

    name = "tpm"

    def touch(self, unit: Unit, t_us: int, weight_us: float, created_us: int) -> None:
        latest = self._latest.get(unit)
        if latest is None or created_us < latest[0]:
            self._set(unit, created_us)


class STPM(_Ranked):
    """Spatio-temporal partial-match management: a priority tree on W (001, Definition 7, Procedure 1).

    The tree is built at the first spill from the latest W of every unit and from then on
    gets one record per state update, as Procedure 1 does; until a spill is needed the
    latest W per unit is all that is kept, so a buffer that never fills costs a dict update
    per state update.
    """

    name = "stpm"

    def touch(self, unit: Unit, t_us: int, weight_us: float, created_us: int) -> None:
        self._set(unit, t_us + weight_us)


def make_policy(name: str) -> SpillPolicy:
    """``"tpm"`` or ``"stpm"``; raises ValueError otherwise."""
    if name == "tpm":
        return TPM()
    if name == "stpm":
        return STPM()
    raise ValueError(f"unknown partial-match policy {name!r} (tpm or stpm)")
