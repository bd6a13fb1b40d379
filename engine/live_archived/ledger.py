"""One live-and-archived query's unfinished work, in ingest positions (docs/architecture.md section 4, issue 43).

The service stamps every accepted event with ``ingest_seq``, its position in the durable ingest order, and a restart
replays the archive in that order from a position. A live-and-archived query's restart position is the smallest
position of any event its unfinished work still needs; that work is kept here, in **one** structure, and the minimum
is read from it (:meth:`Ledger.need`):

- **live instances**: a complete live instance enters when the runner creates it (:meth:`Ledger.enter`, from
  ``Runner.completed``) and leaves when its results are committed: the worker commits a batch's results and then
  calls :meth:`Ledger.committed` (instances the runner answered on the worker's thread: :meth:`Ledger.answered`), or
  commits a deferred request's results and then calls :meth:`Ledger.leave`. Between the two it is in the ledger
  wherever it is (an open subwindow, a live window, a request waiting or in flight, results not yet committed);
- **partial matches of the live side**: every event an open partial match holds has an event time at or after
  the live clock minus the live span minus the lateness (the matcher's window and its lateness buffer), so the
  part is the position of that event time (:meth:`Ledger.settle_live`);
- **events offered, not yet matched**: the ledger knows only what the worker matched, so the need is at most
  one more than the last position matched.

Positions of event times come from the ledger's own index of the batches offered (:meth:`Ledger.offered`): per
batch its first position and its largest ``ts_end``, so a position is never later than an event at or after the
event time (exact in the safe direction, to a batch). An instance's position is the one of its start
(``match.start``): every event of it ends at or after it.

Pure Python, thread-safe: the worker's thread enters and answers, a pool thread leaves when a deferred request's
results are committed. Positions are ints; event times int microseconds UTC.
"""
from __future__ import annotations

import collections
import threading
from collections.abc import Iterable, Sequence
from typing import Any, cast

from sortedcontainers import SortedList

from engine.events import Event

MAX_BATCHES = 4_096
"""Batches the index keeps; beyond it the two oldest merge (positions grow coarser, never wrong)."""


class Ledger:
    """One query's unfinished work and the ingest positions it needs (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._batches: collections.deque[tuple[int, int]] = collections.deque()
        """(first position, largest ``ts_end``) per batch offered, in ingest order."""
        self._open: dict[int, tuple[Any, int]] = {}
        """``id(instance)`` -> (the instance, the position it needs)."""
        self._needs: SortedList = SortedList()
        """The positions of :attr:`_open`, one entry per instance: the smallest is read in O(1), not by a walk of
        thousands of open instances per batch."""
        self._answered: list[int] = []
        """Instances answered on the worker's thread whose results wait for the batch's commit."""
        self.last_seq: int | None = None
        """The last position offered to the runner (None: none yet)."""
        self.live_floor: int | None = None
        """The position the live side's partial matches need (None: not known yet)."""
        self._matching: int | None = None
        """The last position of the batch being matched (:meth:`offered`, :meth:`matched`)."""
        self._acked: int | None = None

    # ------------------------------------------------------------------ what the worker notes

    def offered(
        self, events: Sequence[Event], seqs: Sequence[int | None] | None, upto: int | None = None
    ) -> None:
        """Note a batch about to be matched: ``events`` and their positions ``seqs`` (None, or a None entry: no
        position known, e.g. a row archived before positions existed; such events are not indexed); ``upto``: every
        event of the query's types at or before this position is in this batch or an earlier one (the service's
        last position when it offered the batch: the events of other types between do not concern the query).
        The batch counts as matched at :meth:`matched`."""
        if seqs is not None and len(seqs) != len(events):
            raise ValueError(f"{len(events)} events with {len(seqs)} positions")
        if seqs is None or not seqs:
            known: Sequence[int] = []
            ends: list[int] = []
        elif None in seqs:  # rare: rows archived before positions existed
            pairs = [(s, e.ts_end) for e, s in zip(events, seqs) if s is not None]
            known, ends = [s for s, _ in pairs], [t for _, t in pairs]
        else:
            known, ends = cast(Sequence[int], seqs), [e.ts_end for e in events]
        candidates = [max(known)] if known else []
        if upto is not None and (known or self.last_seq is not None):  # once the query has had an event of its own
            candidates.append(upto)
        last = max(candidates, default=None)
        with self.lock:
            self._matching = last
            if not known:
                return
            first = min(known)
            top = max(ends)
            if self._batches and first >= self._batches[-1][0] and top <= self._batches[-1][1]:
                return  # covered by the last batch's entry: nothing later in it can be needed earlier
            self._batches.append((first, top))
            if len(self._batches) > MAX_BATCHES:  # the two oldest merge: coarser, never later
                a, b = self._batches.popleft(), self._batches.popleft()
                self._batches.appendleft((a[0], max(a[1], b[1])))

    def matched(self) -> None:
        """The batch last noted (:meth:`offered`) is matched: its last position (or its ``upto``) is the last
        position matched. Until then an acknowledgement (a request answered meanwhile) does not count it."""
        with self.lock:
            last, self._matching = self._matching, None
            if last is not None and (self.last_seq is None or last > self.last_seq):
                self.last_seq = last

    def position_of(self, ts_us: int) -> int | None:
        """The first position from which every event ending at or after ``ts_us`` (int us) was offered: the
        first batch whose largest ``ts_end`` reaches it, else one past the last position (None: nothing
        offered yet)."""
        with self.lock:
            return self._position_of(ts_us)

    def _position_of(self, ts_us: int) -> int | None:
        for first, top in self._batches:
            if top >= ts_us:
                return first
        return None if self.last_seq is None else self.last_seq + 1

    def enter(self, instance: Any) -> None:
        """A live instance was created (``instance.match.start``: its start, int us): it needs the position of its
        start until its results are committed."""
        with self.lock:
            pos = self._position_of(instance.match.start)
            if pos is None:
                pos = self._batches[0][0] if self._batches else 0
            old = self._open.get(id(instance))
            if old is not None:
                self._needs.remove(old[1])
            self._open[id(instance)] = (instance, pos)
            self._needs.add(pos)

    def answered(self, instances: Iterable[Any]) -> None:
        """The runner answered ``instances`` on the worker's thread: their results are in the output of the batch
        being matched; they leave at :meth:`committed`."""
        with self.lock:
            self._answered.extend(id(i) for i in instances)

    def committed(self) -> None:
        """The results of the batch just matched are committed: the instances answered in it leave."""
        with self.lock:
            for k in self._answered:
                self._drop(k)
            self._answered.clear()

    def leave(self, instances: Iterable[Any]) -> None:
        """The results of ``instances`` (a deferred request's) are committed: they leave."""
        with self.lock:
            for i in instances:
                self._drop(id(i))

    def _drop(self, key: int) -> None:
        """The instance ``key`` (its ``id``) leaves, if it is in (the lock held)."""
        entry = self._open.pop(key, None)
        if entry is not None:
            self._needs.remove(entry[1])

    def settle_live(self, horizon_us: int | None) -> None:
        """The live side's partial matches hold no event ending before ``horizon_us`` (int us; None: unbounded,
        they may hold any event since the first offered): their part of the need is that event time's position.
        Batches no one can need any more are dropped from the index."""
        with self.lock:
            if horizon_us is None:
                if self.live_floor is None and self._batches:
                    self.live_floor = self._batches[0][0]
                return
            pos = self._position_of(horizon_us)
            if pos is None:
                return
            if self.live_floor is None or pos > self.live_floor:
                self.live_floor = pos
            keep = min(self.live_floor, self._needs[0]) if self._needs else self.live_floor
            while len(self._batches) > 1 and self._batches[1][0] <= keep:
                self._batches.popleft()

    # ------------------------------------------------------------------ what the worker acknowledges

    def need(self) -> int | None:
        """The smallest position the unfinished work needs: its live instances', its partial matches', and one past
        the last position matched; never less than an earlier answer (positions only move forward). The earlier
        answer (None: none) until a batch was matched and the partial matches' part settled (:meth:`settle_live`)."""
        with self.lock:
            if self.last_seq is None or self.live_floor is None:  # the partial matches' part not settled yet
                return self._acked
            value = min(self.last_seq + 1, self.live_floor)
            if self._needs:
                value = min(value, self._needs[0])
            if self._acked is not None and value < self._acked:
                value = self._acked
            self._acked = value
            return value

    def open_instances(self) -> int:
        """Live instances in the ledger (created, results not yet committed)."""
        with self.lock:
            return len(self._open)


__all__ = ["Ledger"]
