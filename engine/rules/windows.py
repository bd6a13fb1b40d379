"""Windowed continuous queries (``AGGREGATE ... WINDOW ...``): the CQ layer of 003 (section 3.3, the CQ rule
format with its WINDOW <length, trigger>; section 5, time and count windows as stateful operators).

:class:`WindowedAggregate` runs one :class:`~engine.lql.ast.AggregateQuery` over a stream and satisfies
:class:`engine.detector.Detector` (``push`` / ``advance`` / ``flush`` / ``stats`` / ``next_deadline``), plus
:meth:`WindowedAggregate.output_watermark` for the rule graph. The full contract is docs/semantics.md
section 8; in short (timestamps are int microseconds UTC):

- **Watermark.** ``W = max(every watermark given to advance, newest accepted ts - allowed lateness - 1)``:
  no event with ``ts <= W`` is accepted any more. An event of the query's type with ``ts <= W`` is **late**:
  dropped, counted (``stats()["late"]``), it never changes a result (no exception is raised).
- **Time windows** (TUMBLING d, SLIDING d EVERY s), event time, aligned to the epoch: window ``k`` covers
  ``[k*s, k*s + d)``; it fires once, when ``W >= k*s + d - 1`` (the watermark passed its end); a window with no
  event (after WHERE) emits nothing. Evaluated by **panes** (Li et al., "No pane, no gain", SIGMOD Record 34(1),
  2005): the time line is cut into panes of ``gcd(d, s)``; each (pane, group) holds a mergeable partial
  aggregate; a firing window merges its ``d / gcd`` panes, or, beyond :data:`TWO_STACKS_PANES` panes, reads
  its group's :class:`_TwoStacks` FIFO aggregator (each complete pane enters it once). A pane is dropped once no
  unfired window covers it, so the state is the partials of the open windows (and no event is kept).
- **Count windows** (COUNT n [EVERY m]), per group, in (ts, id) order: the group's events ``[k*m, k*m + n)``
  form window ``k``. An event's position is final once ``W >= ts`` (no event can come before it), so events
  wait in a buffer bounded by the allowed lateness and arrival order within it does not matter. Window ``k``
  fires when the watermark passes the ts of its n-th event; start = its first event's ts, end (and
  ``window_end``) = its last event's ts + 1. Panes of ``gcd(n, m)`` events. A window that never gets its n
  events (the stream ends, or the group goes silent) never fires, not even at :meth:`flush`. Besides the open
  windows' panes, a count window keeps one position counter per group ever seen (window k of a group is
  numbered from the group's first event).
- **Results**: one :class:`~engine.match.Match` per (window, group) that passes HAVING: ``query`` = NAME,
  ``start`` = window start, ``end`` = window end (exclusive), ``fields`` = RETURN fields plus ``window_end``
  (:data:`engine.rules.derived.WINDOW_END`), ``events`` = ``{}``, ``window_key`` = (group key, (ts, id) of the
  first and of the last event in the window; the id of its derived event is made from it). The results one call
  returns are ordered by (window start, the (ts, id) of the group's first event in the window): the processing
  order, independent of the arrival order within the allowed lateness.
- **Aggregates** over the variable (as over a Kleene variable, docs/semantics.md section 5): ``count(v)`` the
  events; ``sum``/``avg``/``min``/``max`` skip missing values (None when there is none); ``first``/``last``
  the value of the first/last event by (ts, id). A sum of ints is the exact int; a sum with a float is the
  correctly rounded exact sum of the values (each pane keeps Shewchuk's exact float partials, and the firing
  rounds once with :func:`math.fsum` over the panes' partials), so it equals ``math.fsum`` of the window's
  values (ints above 2**53 are added exactly, where ``math.fsum`` would round each first). ``avg`` = that sum
  / the number of values. A non-numeric value makes sum/avg None, incomparable values make min/max None;
  infinite values give inf (nan for +inf with -inf). An aggregate plug-in (issue 16) has no merge in its
  protocol: each pane keeps the (ts, id, value) of its non-None values, folded in (ts, id) order at firing.

This module assigns events to panes and windows and fires them. The partial aggregates are
:mod:`engine.rules.window_accumulators` (exact sums, min/max of one attribute) and :mod:`engine.rules.window_plan`
(a group's partial, and how a merged partial becomes a result); the stores of complete panes are
:mod:`engine.rules.window_panes`.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable
from itertools import count as _counter
from typing import Any

from engine.events import Event
from engine.lql import ast
from engine.match import Match
from engine.nfa.conditions import compile_bool
from engine.rules.filters import single_event_resolver
from engine.rules.window_panes import _CountGroup, _TwoStacks
from engine.rules.window_plan import _FAR_FUTURE, _HEADER, _getter, _Partial, _Plan

TWO_STACKS_PANES = 8
"""Sliding windows of more panes than this are aggregated with :class:`_TwoStacks` (fewer merges); windows
of fewer panes merge their panes directly at firing (cheaper when a window holds few panes)."""


class WindowedAggregate:
    """The window operator of one AGGREGATE statement (module docstring; docs/semantics.md section 8).

    Parameters
    ----------
    query : AggregateQuery
        A checked syntax tree (:func:`engine.lql.parser.parse`).
    allowed_lateness_us : int
        How far (int microseconds >= 0) behind the newest accepted event an event may still arrive.

    Raises
    ------
    ValueError
        For a negative lateness or a window whose size or slide is not positive.
    """

    def __init__(self, query: ast.AggregateQuery, *, allowed_lateness_us: int = 0) -> None:
        if allowed_lateness_us < 0:
            raise ValueError("allowed lateness must be >= 0 microseconds")
        w = query.window
        if w.size <= 0 or w.slide <= 0:
            raise ValueError(f"window size and slide must be > 0 (got {w.size} and {w.slide})")
        self.query = query
        self.name = query.name
        self.type = query.type
        self.lateness = int(allowed_lateness_us)
        self.is_count = w.kind == "count"
        self.size = w.size
        self.slide = w.slide
        self.pane = math.gcd(w.size, w.slide)
        self.pane_step = w.slide // self.pane  # panes between window starts (S)
        self.panes_per_window = w.size // self.pane  # panes in a window (Z)
        self._plan = _Plan(query)
        self._where = compile_bool(query.where, single_event_resolver(query.var)) if query.where is not None else None
        group_by = query.group_by
        if not group_by:
            self._key: Callable[[Event], tuple[Any, ...]] = lambda e: ()
        elif len(group_by) == 1 and group_by[0] not in _HEADER:
            a = group_by[0]
            self._key = lambda e: (e.attrs.get(a),)
        else:
            getters = [_getter(a) for a in group_by]
            self._key = lambda e: tuple(g(e) for g in getters)
        self.watermark = -_FAR_FUTURE  # W: no event with ts <= W is accepted
        self.max_seen: int | None = None
        # time windows: pane index -> {group key -> partial}; a min-heap of the pane indexes
        self._panes: dict[int, dict[Hashable, _Partial]] = {}
        self._pane_heap: list[int] = []
        self._max_pane = -_FAR_FUTURE  # the largest pane index that received an event
        self._next_k: int | None = None  # the smallest window not fired yet (time windows)
        # complete panes by group (sliding windows of many panes): {group key -> _TwoStacks}
        self._stacks: dict[Hashable, _TwoStacks] | None = (
            {} if not self.is_count and self.panes_per_window > TWO_STACKS_PANES else None
        )
        self._deadline = _FAR_FUTURE  # cached next_deadline (time windows), _FAR_FUTURE: none
        # count windows: events waiting for their final position, groups, open windows by start
        self._buffer: list[tuple[int, int, int, Event]] = []
        self._groups: dict[Hashable, _CountGroup] = {}
        self._group_list: list[_CountGroup] = []  # by serial
        self._n_open = 0  # count windows started and not fired
        self._open: list[tuple[int, int, int, int]] = []  # (start ts, first id, group serial, k), lazy
        self._seq = _counter()
        # counters
        self.events = 0
        self.late = 0
        self.ignored = 0
        self.filtered = 0
        self.outside = 0
        self.windows_fired = 0
        self.having_rejected = 0
        self.emitted = 0

    # ------------------------------------------------------------------ Detector

    def push(self, event: Event) -> list[Match]:
        """Offer one event; returns the results of the windows its arrival closed (ordered as in the
        module docstring). A late event (``ts <= W``) is dropped and counted; another type is ignored."""
        if event.type != self.type:
            self.ignored += 1
            return []
        ts = event.ts
        if ts <= self.watermark:
            self.late += 1
            return []
        self.events += 1
        if self.max_seen is None or ts > self.max_seen:
            self.max_seen = ts
            wm = ts - self.lateness - 1
        else:
            wm = self.watermark
        where = self._where
        if where is None or where(event, None, None):
            if self.is_count:
                heapq.heappush(self._buffer, (ts, event.id, next(self._seq), event))
            else:
                self._add_timed(event)
        else:
            self.filtered += 1
        if wm > self.watermark:
            return self._move(wm)
        return []

    def advance(self, watermark_us: int) -> list[Match]:
        """Declare that no event with ``ts <= watermark_us`` will come; returns the results of the windows
        that closed (ordered as in the module docstring)."""
        if watermark_us > self.watermark:
            return self._move(watermark_us)
        return []

    def flush(self) -> list[Match]:
        """End of stream: every time window with an event fires; count windows short of n events never do.
        All state is dropped."""
        out = self._move(_FAR_FUTURE)
        self._groups.clear()
        self._group_list.clear()
        self._open.clear()
        self._n_open = 0
        return out

    def next_deadline(self) -> int | None:
        """The smallest watermark at which :meth:`advance` would fire a window (time windows) or place a
        buffered event (count windows); None when nothing waits."""
        if self.is_count:
            return self._buffer[0][0] if self._buffer else None
        return self._deadline if self._deadline != _FAR_FUTURE else None

    def output_watermark(self, input_watermark_us: int) -> int:
        """A bound ``b`` such that every result emitted from now on has ``start > b`` (the derived stream's
        watermark), given that no input event with ``ts <= input_watermark_us`` will come (whether or not
        :meth:`advance` was called with it)."""
        w = max(self.watermark, input_watermark_us)
        if self.is_count:
            bound = w
            if self._buffer:
                bound = min(bound, self._buffer[0][0] - 1)
            opened = self._open
            while opened:
                start, _, serial, k = opened[0]
                if self._open_is_live(serial, k):
                    bound = min(bound, start - 1)
                    break
                heapq.heappop(opened)
            return bound
        # time: an event still to come (ts > w) lies only in windows with end - 1 > w not fired yet;
        # the events already here wait in the first window with data and the later ones
        k_future = (w - self.size + 1) // self.slide + 1
        if self._next_k is not None and self._next_k > k_future:
            k_future = self._next_k
        k_data = self._first_window_with_data()
        if k_data is not None:
            k_future = min(k_future, k_data)
        return k_future * self.slide - 1

    def stats(self) -> dict[str, Any]:
        """Counters (JSON-ready): events accepted, late, ignored (other type), filtered (WHERE false), outside
        (in no window: a slide larger than the size), windows_fired ((window, group) pairs), having_rejected,
        emitted; state: open_windows (windows not fired between the first and the last that hold an event; count
        windows: started and not fired), groups (groups with state), open_panes, open_partials ((pane, group)
        partials), buffered (count windows: events waiting for their position), watermark."""
        if self.is_count:
            open_windows = self._n_open
            groups = len(self._groups)
            open_panes = sum(
                len(g.panes) + (len(g.stacks.front) + len(g.stacks.back) if g.stacks else 0)
                for g in self._groups.values()
            )
            open_partials = open_panes
        else:
            k_lo = self._first_window_with_data()
            open_windows = 0 if k_lo is None else max(0, self._max_pane // self.pane_step - k_lo + 1)
            keys: set[Hashable] = set()
            for by_group in self._panes.values():
                keys.update(by_group)
            keys.update(self._stacks or ())
            groups = len(keys)
            open_panes = len(self._panes)
            open_partials = sum(len(p) for p in self._panes.values()) + sum(
                len(t.front) + len(t.back) for t in (self._stacks or {}).values()
            )
        return {
            "events": self.events,
            "late": self.late,
            "ignored": self.ignored,
            "filtered": self.filtered,
            "outside": self.outside,
            "windows_fired": self.windows_fired,
            "having_rejected": self.having_rejected,
            "emitted": self.emitted,
            "open_windows": open_windows,
            "groups": groups,
            "open_panes": open_panes,
            "open_partials": open_partials,
            "buffered": len(self._buffer),
            "watermark": self.watermark,
        }

    # ------------------------------------------------------------------ time windows

    def _add_timed(self, event: Event) -> None:
        p = event.ts // self.pane
        if p % self.pane_step >= self.panes_per_window:
            self.outside += 1
            return
        if p > self._max_pane:
            self._max_pane = p
        groups = self._panes.get(p)
        if groups is None:
            groups = self._panes[p] = {}
            heapq.heappush(self._pane_heap, p)
            k_first = -((self.panes_per_window - 1 - p) // self.pane_step)  # ceil((p - Z + 1) / S)
            if self._next_k is not None:
                k_first = max(k_first, self._next_k)
            deadline = k_first * self.slide + self.size - 1
            if deadline < self._deadline:
                self._deadline = deadline
        key = self._key(event)
        part = groups.get(key)
        if part is None:
            part = groups[key] = _Partial(self._plan.orders, self._plan.n_plugin)
        self._plan.add(part, event)

    def _first_window_with_data(self) -> int | None:
        """The first window not fired yet that holds an event (None: no event waits)."""
        if self._stacks:  # complete panes wait: they lie in window _next_k (the stacks keep panes >= its start)
            return self._next_k
        if not self._pane_heap:
            return None
        p = self._pane_heap[0]
        k = -((self.panes_per_window - 1 - p) // self.pane_step)
        if self._next_k is not None and self._next_k > k:
            k = self._next_k
        return k

    def _move(self, wm: int) -> list[Match]:
        self.watermark = wm
        if self.is_count:
            return self._place(wm)
        out: list[Match] = []
        if self._deadline > wm:
            return out
        S, Z = self.pane_step, self.panes_per_window
        panes, heap, stacks, plan = self._panes, self._pane_heap, self._stacks, self._plan
        while True:
            k = self._first_window_with_data()
            if k is None:
                self._deadline = _FAR_FUTURE
                break
            end = k * self.slide + self.size
            if end - 1 > wm:
                self._deadline = end - 1
                break
            lo = k * S
            per_group: dict[Hashable, list[_Partial]] = {}
            if stacks is not None:
                while heap and heap[0] < lo + Z:  # the window's panes are complete: into the stacks
                    p = heapq.heappop(heap)
                    for g, part in panes.pop(p).items():
                        st = stacks.get(g)
                        if st is None:
                            st = stacks[g] = _TwoStacks()
                        st.push(p, part, plan)
                for g, st in stacks.items():
                    agg = st.query(plan)
                    if agg is not None:
                        per_group[g] = [agg]
                self._fire(k * self.slide, end, per_group, out)
                self._next_k = k + 1
                for g in list(stacks):
                    st = stacks[g]
                    st.evict(lo + S, plan)
                    if not st.front and not st.back:
                        del stacks[g]
                continue
            # merge the window's panes per group
            if Z == 1:
                groups = panes.get(lo)
                if groups:
                    per_group = {g: [p] for g, p in groups.items()}
            else:
                for pi in range(lo, lo + Z):
                    groups = panes.get(pi)
                    if groups:
                        for g, part in groups.items():
                            lst = per_group.get(g)
                            if lst is None:
                                per_group[g] = [part]
                            else:
                                lst.append(part)
            self._fire(k * self.slide, end, per_group, out)
            self._next_k = k + 1
            horizon = (k + 1) * S
            while heap and heap[0] < horizon:
                del panes[heapq.heappop(heap)]
        return out

    def _fire(self, start: int, end: int, per_group: dict[Hashable, list[_Partial]], out: list[Match]) -> None:
        plan = self._plan
        merged = [(plan.merge(parts), key) for key, parts in per_group.items()]
        if len(merged) > 1:
            merged.sort(key=lambda pk: pk[0].first)
        for part, key in merged:
            self.windows_fired += 1
            m = plan.result(self.name, part, key, start, end)  # type: ignore[arg-type]
            if m is None:
                self.having_rejected += 1
            else:
                self.emitted += 1
                out.append(m)

    # ------------------------------------------------------------------ count windows

    def _open_is_live(self, serial: int, k: int) -> bool:
        return k in self._group_list[serial].starts

    def _place(self, wm: int) -> list[Match]:
        buf = self._buffer
        fired: list[tuple[tuple[int, int], Match | None]] = []
        n, m = self.size, self.slide
        S, Z, g_size = self.pane_step, self.panes_per_window, self.pane
        plan = self._plan
        while buf and buf[0][0] <= wm:
            event = heapq.heappop(buf)[3]
            key = self._key(event)
            grp = self._groups.get(key)
            if grp is None:
                grp = self._groups[key] = _CountGroup(key, len(self._group_list), Z > TWO_STACKS_PANES)
                self._group_list.append(grp)
            i = grp.pos
            grp.pos += 1
            if i % m >= n:
                self.outside += 1
                continue
            if i % m == 0:  # the first event of window i // m
                k = i // m
                grp.starts[k] = event.ts
                self._n_open += 1
                heapq.heappush(self._open, (event.ts, event.id, grp.serial, k))
            p = i // g_size
            part = grp.panes.get(p)
            if part is None:
                part = grp.panes[p] = _Partial(plan.orders, plan.n_plugin)
            plan.add(part, event)
            stacks = grp.stacks
            if stacks is not None and (i + 1) % g_size == 0:  # the pane is complete
                stacks.push(p, grp.panes.pop(p), plan)
            if (i - n + 1) % m == 0 and i >= n - 1:  # the n-th event of window (i - n + 1) // m
                k = (i - n + 1) // m
                start = grp.starts.pop(k)
                self._n_open -= 1
                if stacks is not None:
                    merged = stacks.query(plan)
                    assert merged is not None
                    stacks.evict((k + 1) * S, plan)
                else:
                    merged = plan.merge([grp.panes[q] for q in range(k * S, k * S + Z) if q in grp.panes])
                    for q in [q for q in grp.panes if q < (k + 1) * S]:
                        del grp.panes[q]
                self.windows_fired += 1
                fired.append((merged.first, plan.result(self.name, merged, key, start, event.ts + 1)))
        if len(self._open) > 2 * self._n_open + 64:  # drop the entries of fired windows (lazy deletion)
            self._open = [o for o in self._open if self._open_is_live(o[2], o[3])]
            heapq.heapify(self._open)
        fired.sort(key=lambda fm: fm[0])
        out: list[Match] = []
        for _, match in fired:
            if match is None:
                self.having_rejected += 1
            else:
                self.emitted += 1
                out.append(match)
        return out


__all__ = ["WindowedAggregate"]
