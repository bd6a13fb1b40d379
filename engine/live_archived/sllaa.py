"""SLLAA: LLAA over subwindows of live instances (001 section 4.3 (2), Lemma 1, Algorithm 3).

Completed live instances ``I_i, I_i+1, ...`` are grouped into a subwindow while
``|min_k I_k.start - I.end| <= T_L``, the user's tolerated delay: the subwindow closes when the
watermark passes its earliest start plus ``T_L`` (Lemma 1), when it holds ``max_batch``
instances, or when the query's streams are quiet (:meth:`SLLAA.idle`: idle or ended; its instances are
complete and their ranges archived, so closing early changes no result) or end (``flush``).
A closed subwindow makes **one** archive request: the union of its instances' access
ranges, merged, grouped by key. ``P_A`` is matched once over the result and every instance of the
subwindow is joined with the archived instances that lie in its *own* access range. Every
instance's whole range is requested, so nothing is lost at subwindow edges.

    Cost_SLLAA = |W_L| Cost_L + n Cost_RDB + sum_{i<=n} Cost_A |R_Ai| + Cost_join N_P + ...  (001 eq. 4)

with ``n`` subwindows instead of ``N_InstL`` requests.
"""
from __future__ import annotations

from collections.abc import Hashable

from engine.live_archived.base import LiveInstance, Runner, never_equal
from engine.live_archived.plan import NO_KEY, LiveArchivedPlan, Range, merge_ranges
from engine.live_archived.source import ArchiveSource
from engine.live_archived.store import InstanceStore
from engine.match import Match

DEFAULT_MAX_BATCH = 1000


class SLLAA(Runner):
    """Subwindow LLAA (see the module docstring).

    Parameters
    ----------
    tolerance_us : int
        ``T_L``, the tolerated delay, int microseconds (>= 0).
    max_batch : int
        Close a subwindow once it holds this many live instances.
    """

    algorithm = "sllaa"
    index_by_start = True

    def __init__(
        self,
        plan: LiveArchivedPlan,
        source: ArchiveSource,
        *,
        tolerance_us: int = 0,
        max_batch: int = DEFAULT_MAX_BATCH,
        **kw: object,
    ) -> None:
        if tolerance_us < 0 or max_batch < 1:
            raise ValueError("tolerance_us must be >= 0 and max_batch >= 1")
        super().__init__(plan, source, **kw)  # type: ignore[arg-type]
        self.tolerance_us = tolerance_us
        self.max_batch = max_batch
        self.sub: list[LiveInstance] = []
        self.earliest: int | None = None
        self.subwindows = 0
        self.largest = 0
        self.closed_idle = 0
        """Subwindows closed because the query's streams were quiet (:meth:`idle`)."""

    def on_time(self) -> list[Match]:
        if self.earliest is not None and self.watermark > self.earliest + self.tolerance_us:
            return self.close()
        return []

    def on_instances(self, insts: list[LiveInstance]) -> list[Match]:
        out: list[Match] = []
        for inst in insts:
            self.sub.append(inst)
            start = inst.match.start
            if self.earliest is None or start < self.earliest:
                self.earliest = start
            if len(self.sub) >= self.max_batch:
                out += self.close()
        out += self.on_time()  # an instance longer than T_L: the watermark has passed already
        return out

    def finish(self) -> list[Match]:
        return self.close()

    def idle(self) -> list[Match]:
        """The streams are quiet: close the open subwindow now (see :meth:`Runner.idle`)."""
        if self.sub:
            self.closed_idle += 1
        return self.close()

    def own_deadline(self) -> int | None:
        """The watermark that closes the open subwindow: its earliest start + ``T_L`` + 1 us (Lemma 1)."""
        return None if self.earliest is None else self.earliest + self.tolerance_us + 1

    def waiting(self) -> list[LiveInstance]:
        return self.sub

    def close(self) -> list[Match]:
        """Close the current subwindow: one archive request answers it (now, or deferred)."""
        sub, self.sub, self.earliest = self.sub, [], None
        if not sub:
            return []
        self.subwindows += 1
        self.largest = max(self.largest, len(sub))
        return self.submit(sub, self.answer, mergeable=True)

    def answer(self, sub: list[LiveInstance]) -> list[Match]:
        """One archive request over the merged access ranges of ``sub``; join every instance."""
        return [r for found in self.answer_each(sub) for r in found]

    def answer_each(self, sub: list[LiveInstance]) -> list[list[Match]]:
        """:meth:`answer`, with the results of each instance of ``sub`` apart: ``out[i]`` holds those of ``sub[i]``
        in the order :meth:`answer` emits them (one archive request for all; an instance whose key is missing,
        :data:`~engine.live_archived.plan.NO_KEY`, has none)."""
        plan = self.plan
        keyed = plan.key is not None
        wanted: list[tuple[int, LiveInstance, Hashable, Range]] = []
        ranges: dict[Hashable, list[Range]] = {}
        for i, inst in enumerate(sub):
            key = plan.key_of(inst.match)
            if key is NO_KEY:
                continue
            rng = self.access(inst)
            wanted.append((i, inst, key, rng))
            ranges.setdefault(key, []).append(rng)
        out: list[list[Match]] = [[] for _ in sub]
        if not wanted:
            return out
        request = {k: merge_ranges(v) for k, v in ranges.items()}
        if self.known_ranges is not None and self.known_ranges.index_of is not None:
            if self.join_known(request, wanted, out):
                return out
            found = [j for matches in self.archived_in(request, logical=False).values() for j in matches]
        elif self.known_ranges is not None:  # only what no earlier subwindow read
            found = [j for matches in self.archived_in(request).values() for j in matches]
        else:
            events = self.request(None, request) if keyed else self.request(None, request[None])
            found = self.match_archived(events)
        hashed = keyed and bool(plan.join_equi)
        try:
            store = self._index(found, hashed)
        except TypeError:  # an unhashable value (a list attribute): its equalities are compared pair by pair
            hashed = False
            store = self._index(found, hashed)
        with self.lock:
            for i, inst, key, (lo, hi) in wanted:
                at: Hashable = key
                if hashed:
                    live = self._live_sides(inst)
                    if live is None:
                        continue
                    at = (key, live)
                try:
                    candidates = store.candidates(at, lo, hi)
                except TypeError:  # unhashable here, every archived side hashable: no equality holds
                    continue
                self.join(inst, candidates, out[i], equi_checked=hashed)
        return out

    def _index(self, found: list[Match], hashed: bool) -> InstanceStore:
        """The archived instances ``found`` by archive key and, when ``hashed``, by their archived sides of JOIN's
        equalities too (:attr:`LiveArchivedPlan.join_equi`: a hash join, a live instance meets only the archived
        instances with its own values; those with a null side join nothing and are left out), each key's in start
        order for the search by access range.

        Raises
        ------
        TypeError
            With ``hashed``, for an unhashable archived value.
        """
        plan = self.plan
        store = InstanceStore(plan)
        for j in found:
            if not hashed:
                store.add(j)
                continue
            values = self._equi_values(j)
            if not any(never_equal(v) for v in values):
                store.add_under((plan.archived_key(j), values), j)
        return store

    def stats(self) -> dict[str, object]:
        d = super().stats()
        d["sllaa"] = {
            "tolerance_us": self.tolerance_us,
            "max_batch": self.max_batch,
            "subwindows": self.subwindows,
            "largest_subwindow": self.largest,
            "closed_idle": self.closed_idle,
        }
        return d
