"""Archived instances kept in memory, by archive key and start (ALAA and OLLAA's archive-driven mode).

ALAA (001 section 4.1) and the archive-driven side of OLLAA (001 section 4.3) find archived
instances *before* the live instances that join them. They are kept here, per key (the
:class:`~engine.live_archived.plan.KeyPlan` attribute's value, or one bucket without a key plan),
sorted by start, so the candidates of a live instance are a binary search away: those starting
in its access range.
"""
from __future__ import annotations

import bisect
import itertools
from collections.abc import Hashable, Iterator
from typing import Any

from engine.live_archived.plan import LiveArchivedPlan
from engine.match import Match


def keep_sorted(order: list[Any], items: list[Any], at: Any, item: Any) -> None:
    """Put ``item`` into ``items`` where its sort key ``at`` belongs in ``order`` (two parallel lists sorted by
    ``order``; an append when ``at`` is the largest, the usual case)."""
    if not order or at > order[-1]:
        order.append(at)
        items.append(item)
    else:
        i = bisect.bisect_left(order, at)
        order.insert(i, at)
        items.insert(i, item)


class InstanceStore:
    """Archived instances of one query, by key, in start order.

    Parameters
    ----------
    plan : LiveArchivedPlan
        Gives each instance's key (:meth:`LiveArchivedPlan.archived_key`) and the qualification rule.
    """

    def __init__(self, plan: LiveArchivedPlan) -> None:
        self.plan = plan
        self._by_key: dict[Hashable, tuple[list[tuple[int, int]], list[Match]]] = {}
        self._seq = itertools.count()
        self.size = 0

    def add(self, j: Match) -> None:
        """Keep archived instance ``j`` under its archive key."""
        self.add_under(self.plan.archived_key(j), j)

    def add_under(self, key: Hashable, j: Match) -> None:
        """Keep archived instance ``j`` under ``key`` (SLLAA's hash join: its archive key with its JOIN equality
        values).

        Raises
        ------
        TypeError
            For an unhashable ``key``.
        """
        bucket = self._by_key.get(key)
        if bucket is None:
            bucket = self._by_key[key] = ([], [])
        order, items = bucket
        keep_sorted(order, items, (j.start, next(self._seq)), j)
        self.size += 1

    def candidates(self, key: Hashable, lo_us: int, hi_us: int) -> Iterator[Match]:
        """Instances of ``key`` whose start lies in ``[lo_us, hi_us)``, in start order (then the order kept).

        Raises
        ------
        TypeError
            For an unhashable ``key``.
        """
        bucket = self._by_key.get(key)
        if bucket is None:
            return iter(())
        order, items = bucket
        i = bisect.bisect_left(order, (lo_us, -1))
        j = bisect.bisect_left(order, (hi_us, -1))
        return iter(items[i:j])

    def has_candidate(self, key: Hashable, i_start: int) -> bool:
        """Whether some kept instance of ``key`` qualifies for a live instance starting at ``i_start``."""
        qualifies = self.plan.qualifies
        return any(qualifies(i_start, j) for j in self.candidates(key, i_start - self.plan.lookback_us, i_start))

    def evict(self, before_us: int) -> int:
        """Forget instances starting before ``before_us``; return how many."""
        dropped = 0
        empty = []
        for key, (order, items) in self._by_key.items():
            i = bisect.bisect_left(order, (before_us, -1))
            if i:
                del order[:i]
                del items[:i]
                dropped += i
            if not order:
                empty.append(key)
        for key in empty:
            del self._by_key[key]
        self.size -= dropped
        return dropped
