"""The partial-match buffer (PMB): at most ``capacity`` partial matches in memory (docs/architecture.md section 7.6).

After Peng et al., *Complex Event Processing over Live Archived Data Streams*
(001_e24f905c15fdf08b.txt, section 5, Procedure 1). The matcher calls :meth:`before`
for an event whose key has spilled partial matches (so every partial match the event can
touch is in memory: a **miss** reloads spilled ones; every other event is a **hit**) and
:meth:`after` once the buffer is watching (records the state update for the spill policy
and spills ``ΔR`` partial matches in one batch when the buffer is over capacity).

The no-spill path is kept to two O(1) tests per event in the matcher: nothing is recorded
until the live partial matches first exceed the capacity (:attr:`PartialMatchBuffer.watch_from`);
at that first spill TPM's ranking is rebuilt from the resident partial matches and STPM's
``Δt``/``p`` statistics are bootstrapped from them (:meth:`PartialMatchBuffer._bootstrap`).
Until then sweeps forget nothing per key, and hits are counted as events minus the events
that missed.

The unit of spilling is the paper's partial-match entity ``PM_e`` of one object (TID): all
partial matches of one partition key in one plan. Its priority is refreshed whenever an
event of that key changes its state, including an event that completes matches (then
``p(E_{n+1} | E_n) = 0``), so a key whose pattern has just completed drops in priority
even though it still holds runs that could start over. The index says, per (partition
key, NFA state), which partial matches are spilled: the store keeps one row per (key,
NFA state) (run storage) or per key (-1: a chain-partitioned chain links its states), and
an event reloads a key only when it needs a state that has spilled partial matches.

STPM's estimates (Definition 7), learnt online from the stream from the first spill on:
``Δt_i`` is the largest gap seen between an ``E_i`` event and a later ``E_{i+1}`` event of
the same key within the window; ``p(E_{i+1} | E_i)`` is the fraction of ``E_i`` events that
an ``E_{i+1}`` event of the same key followed within the window. At the first spill they
start from what the resident partial matches show (the events bound at consecutive NFA
states), so a buffer that never fills learns nothing.

Spilling never changes results: spilled partial matches are reloaded before any event that
could read them, and a key with spilled partial matches is never forgotten.
"""
from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import orjson

from engine.events import Event
from engine.pm.codec import decode_chain, decode_runs, encode_chain, encode_runs
from engine.pm.policy import make_policy
from engine.pm.store import MemoryStore, PartialMatchStore, SpilledBatch

if TYPE_CHECKING:
    from engine.matcher import Matcher

Unit = tuple[int, Hashable]
"""(plan index, partition key)."""

CHAIN = -1
"""The store's NFA-state column for a whole chain of chain-partitioned storage."""


def encode_key(key: Hashable) -> str:
    """A partition key as stable JSON text (the store's key column)."""
    return orjson.dumps(key, option=orjson.OPT_NON_STR_KEYS).decode()


class PartialMatchBuffer:
    """Keeps a matcher's partial matches within ``capacity``, spilling to a :class:`PartialMatchStore`.

    Parameters
    ----------
    matcher : Matcher
        The matcher whose states are managed (it calls the hooks).
    capacity : int
        Partial matches allowed in memory (runs, or chain nodes); ``>= 1``.
    policy : {"stpm", "tpm"}
    store : PartialMatchStore, optional
        Default: an in-memory store.
    batch : int, optional
        ``ΔR``: partial matches spilled at once; default 10% of the capacity (at least 1).
    query_id : str, optional
        Names the query's rows in the store; default the query's NAME or ``"query"``. Rows of
        that name already in the store are deleted here (orphans of an interrupted run), so
        one store must not serve two concurrent runs of the same query name.

    Raises
    ------
    ValueError
        For a capacity or batch below 1, or an unknown policy.
    """

    def __init__(
        self,
        matcher: Matcher,
        capacity: int,
        policy: str = "stpm",
        store: PartialMatchStore | None = None,
        batch: int | None = None,
        query_id: str | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError("pm_capacity must be at least 1 partial match")
        self.m = matcher
        self.capacity = capacity
        self.batch = batch if batch is not None else max(1, capacity // 10)
        if self.batch < 1:
            raise ValueError("the spill batch (ΔR) must be at least 1 partial match")
        self.policy = make_policy(policy)
        self.learn = self.policy.name == "stpm"
        self.watch_from = capacity
        """The matcher calls :meth:`after` once ``live`` first exceeds this (then on every event)."""
        self.watching = False
        self.active = False
        self.missed_events = 0
        self.store: PartialMatchStore = store if store is not None else MemoryStore()
        self.query_id = query_id or matcher.query.name or "query"
        # the index starts empty: rows of this query already in the store are orphans of an interrupted
        # run (a run that ends flushes them) and would be read back as this run's partial matches
        self.store.clear(self.query_id)
        self.chain = matcher.storage == "chain"
        # the index: unit -> {NFA state (or CHAIN): [partial matches, payload bytes, latest max_ts of its batches]}
        self.spilled: dict[Unit, dict[int, list[int]]] = {}
        self.spilled_keys: dict[Hashable, int] = {}
        self.keys: dict[str, Hashable] = {}
        self.stats = {"spilled": 0, "reloaded": 0, "misses": 0, "expired": 0, "pms_bytes": 0}
        plans = matcher.query.plans
        self.kleene = [[s.kleene for s in p.slots] for p in plans]
        self.slot_of_type = [{t: tuple(sorted(js, reverse=True)) for t, js in p.slot_of_type.items()} for p in plans]
        self.window = matcher.query.window_us
        # STPM estimates per plan and slot i (between E_i and E_{i+1})
        self.seen = [[0] * len(p.slots) for p in plans]
        self.followed = [[0] * len(p.slots) for p in plans]
        self.max_gap = [[0] * len(p.slots) for p in plans]
        self.last_seen: list[dict[Hashable, list[int | None]]] = [{} for _ in plans]

    # ------------------------------------------------------------------ hooks

    def counters(self) -> dict[str, int]:
        """created (by the matcher), spilled, reloaded, hits, misses, expired and pms_bytes (bytes in the PMS).

        ``hits``: events that needed no reload (every event of a key with nothing spilled counts);
        ``misses``: reloads of a unit (one event may reload one unit per plan).
        """
        return {**self.stats, "hits": self.m.counters.events - self.missed_events}

    def before(self, key: Hashable, states: list[Any], e: Event) -> None:
        """Reload the spilled partial matches ``e`` can read (each reload a miss).

        The matcher calls it only when ``key`` has spilled partial matches (:meth:`has_spilled`).
        Spilled partial matches that all began before ``e.ts - window`` cannot be extended by
        ``e`` (the matcher would drop them): they are not needed, stay in the store until
        :meth:`expire` deletes them, and cost no miss.
        """
        if key not in self.spilled_keys:
            return
        missed = False
        lower = e.ts - self.window if self.window is not None else None
        for p, (engine, st) in enumerate(zip(self.m.engines, states)):
            spilled = self.spilled.get((p, key))
            if spilled is None:
                continue
            if self.chain:
                slots: Any = spilled if e.type in engine.plan.slot_of_type else ()
            else:
                slots = [j for j in engine.visit.get(e.type, engine.default_visit) if j in spilled]
            if lower is None:
                needed = bool(slots)
            else:
                needed = any(spilled[j][2] >= lower for j in slots)
            if needed:
                self._load((p, key), st, e.ts)
                missed = True
        if missed:
            self.missed_events += 1

    def after(self, key: Hashable, states: list[Any], e: Event, completed: bool) -> None:
        """Record the state update for the policy (Procedure 1) and spill when over capacity.

        ``completed``: ``e`` completed matches. The matcher calls it once ``live`` first exceeds
        :attr:`watch_from` (the capacity): :meth:`_activate` then ranks every resident key.
        """
        learn = self.learn
        if not self.active:
            if self.m.counters.live <= self.capacity:
                return
            self.watching = True
            self._activate()
            learn = False  # the bootstrap has seen e already
        etype = e.type
        for p, st in enumerate(states):
            slots = self.slot_of_type[p].get(etype)
            if not slots:
                continue
            if learn:
                self._learn(p, key, slots, e.ts)
            self._touch(p, key, st, slots, e, completed)
        if self.m.counters.live > self.capacity:
            self._spill()

    def expire(self, lower_ts: int) -> None:
        """Delete spilled batches whose partial matches all left the window."""
        if not self.spilled:
            return  # the index lists every batch in the store: nothing to ask
        for b in self.store.delete_expired(self.query_id, lower_ts):
            unit = (b.plan, self.keys.get(b.key))
            self._unindex(unit, b.slot, b.count, b.nbytes)
            self.stats["expired"] += b.count

    def discard_key(self, key: Hashable) -> None:
        """Drop every spilled partial match of ``key`` (strict contiguity: another key's event came)."""
        for unit in [u for u in self.spilled if u[1] == key]:
            for slot in list(self.spilled.get(unit, {})):
                for b in self.store.take(self.query_id, unit[0], encode_key(key), slot):
                    self._unindex(unit, slot, b.count, b.nbytes)

    def forget_key(self, key: Hashable) -> None:
        """The matcher dropped an idle key's state: forget its priority and statistics."""
        for p in range(len(self.kleene)):
            self.last_seen[p].pop(key, None)
            self.policy.forget((p, key))

    def has_spilled(self, key: Hashable) -> bool:
        return key in self.spilled_keys

    def spilled_count(self) -> int:
        return sum(v[0] for slots in self.spilled.values() for v in slots.values())

    def clear(self) -> None:
        """End of stream: empty the store and the index."""
        self.store.clear(self.query_id)
        self.spilled.clear()
        self.spilled_keys.clear()
        self.stats["pms_bytes"] = 0

    def weight(self, p: int, j: int) -> float:
        """``Δt_j · p(E_{j+1} | E_j)`` in microseconds (0 for the last state)."""
        seen = self.seen[p][j]
        if not seen:
            return 0.0
        return self.max_gap[p][j] * min(1.0, self.followed[p][j] / seen)

    # ------------------------------------------------------------------ policy bookkeeping

    def _touch(self, p: int, key: Hashable, st: Any, slots: tuple[int, ...], e: Event, completed: bool) -> None:
        bound = None  # the highest NFA state e entered, and when its partial match began
        for j in slots:  # descending
            if self.chain:
                d = st.nodes[j]
                if d and d[-1].event is e:
                    bound = (j, d[-1].max_start)
            else:
                bucket = st.by_slot[j]
                if bucket:
                    run = bucket[-1]
                    b = run[1][j]
                    if (b[-1] if self.kleene[p][j] else b) is e:
                        bound = (j, run[0])
            if bound is not None:
                break
        if bound is None and completed:
            bound = (len(self.kleene[p]) - 1, e.ts)
        if bound is not None:
            self.policy.touch((p, key), e.ts, self.weight(p, bound[0]), bound[1])

    def _activate(self) -> None:
        """First fill: rank every resident key by its newest partial match (TPM: its oldest)."""
        self.active = True
        if self.learn:
            self._bootstrap()
        for key, states in self.m.states.items():
            st: Any
            for p, st in enumerate(states):
                newest = oldest = None
                if self.chain:
                    for j, d in enumerate(st.nodes):
                        if d:
                            newest = max(newest or (0, 0), (d[-1].event.ts, j))
                            oldest = min(d[0].event.ts, oldest if oldest is not None else d[0].event.ts)
                else:
                    for j, bucket in enumerate(st.by_slot):
                        if bucket:
                            b = bucket[-1][1][j]
                            newest = max(newest or (0, 0), ((b[-1] if self.kleene[p][j] else b).ts, j))
                            first = min(r[0] for r in bucket)
                            oldest = min(first, oldest if oldest is not None else first)
                if newest is not None and oldest is not None:
                    self.policy.touch((p, key), newest[0], self.weight(p, newest[1]), oldest)

    def _bootstrap(self) -> None:
        """STPM's first estimates, from the partial matches resident at the first spill.

        Per plan and NFA state i: ``seen`` counts the distinct ``E_i`` events bound at state i,
        ``followed`` those of them that a partial match also binds an ``E_{i+1}`` event after,
        and ``max_gap`` is the largest gap between the two. Partial matches that left the window
        are not seen. A match that completed is not kept (unless its last component is a Kleene
        closure), so the last transition ``E_{n-1} -> E_n`` is left to the online counts: counting
        its ``E_{n-1}`` events here without their completions would bias ``p`` low.
        """
        for key, states in self.m.states.items():
            st: Any
            for p, st in enumerate(states):
                seen, followed, gap = self.seen[p], self.followed[p], self.max_gap[p]
                final = len(self.kleene[p]) - 1
                skip = final - 1 if not self.kleene[p][final] else -1  # see above: learnt online only
                if self.chain:
                    heads: list[set[int]] = [set() for _ in st.nodes]  # ids of slot-j nodes a slot j+1 node follows
                    for j, d in enumerate(st.nodes):
                        for node in d if j else ():
                            t = node.event.ts
                            for pred in node.preds:
                                if pred.slot == j - 1:
                                    heads[j - 1].add(id(pred))
                                    if t - pred.event.ts > gap[j - 1]:
                                        gap[j - 1] = t - pred.event.ts
                    chain_waiting: list[int | None] = []
                    for j, d in enumerate(st.nodes):
                        chain_waiting.append(max((n.event.ts for n in d if id(n) not in heads[j]), default=None))
                        if j != skip:
                            seen[j] += len(d)
                            followed[j] += len(heads[j])
                    if any(t is not None for t in chain_waiting):
                        self.last_seen[p][key] = chain_waiting
                    continue
                kleene = self.kleene[p]
                bound: list[dict[int, int]] = [{} for _ in kleene]  # event id -> ts
                extended: list[set[int]] = [set() for _ in kleene]
                for j, runs in enumerate(st.by_slot):
                    for run in runs:
                        env = run[1]
                        for i in range(j + 1):
                            last = env[i][-1] if kleene[i] else env[i]
                            bound[i][last.id] = last.ts
                            if i < j:
                                extended[i].add(last.id)
                                nxt = env[i + 1][0] if kleene[i + 1] else env[i + 1]
                                if nxt.ts - last.ts > gap[i]:
                                    gap[i] = nxt.ts - last.ts
                waiting: list[int | None] = [None] * len(kleene)  # _learn's last_seen: latest unfollowed
                for i in range(len(kleene)):
                    waiting[i] = max((t for x, t in bound[i].items() if x not in extended[i]), default=None)
                    if i == skip:
                        continue
                    seen[i] += len(bound[i])
                    followed[i] += len(extended[i])
                if any(t is not None for t in waiting):
                    self.last_seen[p][key] = waiting

    def _learn(self, p: int, key: Hashable, slots: tuple[int, ...], t: int) -> None:
        per_key = self.last_seen[p]
        last = per_key.get(key)
        if last is None:
            last = per_key[key] = [None] * len(self.seen[p])
        seen = self.seen[p]
        for j in slots:  # descending: an event never follows itself
            if j:
                prev = last[j - 1]
                if prev is not None:
                    gap = t - prev
                    if self.window is None or gap <= self.window:
                        self.followed[p][j - 1] += 1
                        if gap > self.max_gap[p][j - 1]:
                            self.max_gap[p][j - 1] = gap
                    last[j - 1] = None  # each E_{j-1} event counts as followed once
            seen[j] += 1
            last[j] = t

    # ------------------------------------------------------------------ spill and reload

    def _spill(self) -> None:
        # ΔR at a time; more when a reload overshot the capacity by more than that
        need = max(self.batch, self.m.counters.live - self.capacity)
        batches: list[SpilledBatch] = []
        for victim in self.policy.victims():
            unit: Unit = victim  # type: ignore[assignment]
            p, key = unit
            states = self.m.states.get(key)
            self.policy.forget(unit)
            if states is None:
                continue
            ekey = encode_key(key)
            self.keys[ekey] = key
            n = self._spill_unit(unit, states[p], ekey, batches)
            need -= n
            if need <= 0:
                break
        if batches:
            self.store.write(batches)

    def _spill_unit(self, unit: Unit, st: Any, ekey: str, out: list[SpilledBatch]) -> int:
        p = unit[0]
        parts: list[tuple[int, int, int, bytes]] = []  # (slot, count, max_ts, payload)
        if self.chain:
            nodes = [list(d) for d in st.nodes]
            n = sum(len(d) for d in nodes)
            if n:
                max_ts = max(node.event.ts for d in nodes for node in d)
                parts.append((CHAIN, n, max_ts, encode_chain(nodes)))
                for d in st.nodes:
                    d.clear()
        else:
            for j, runs in enumerate(st.by_slot):
                if runs:
                    parts.append((j, len(runs), max(r[0] for r in runs), encode_runs(runs, self.kleene[p])))
                    st.by_slot[j] = []
        total = 0
        for slot, n, max_ts, payload in parts:
            out.append(SpilledBatch(self.query_id, p, ekey, slot, n, max_ts, payload))
            self._index(unit, slot, n, len(payload), max_ts)
            total += n
        self.stats["spilled"] += total
        self.m.counters.live -= total
        return total

    def _load(self, unit: Unit, st: Any, now: int) -> None:
        p, key = unit
        ekey = encode_key(key)
        n = 0
        for slot in list(self.spilled.get(unit, {})):
            for b in self.store.take(self.query_id, p, ekey, slot):
                if slot == CHAIN:
                    for j, nodes in enumerate(decode_chain(b.payload, len(st.nodes))):
                        st.nodes[j].prepend(nodes)
                else:
                    st.by_slot[slot] = decode_runs(b.payload, self.kleene[p]) + st.by_slot[slot]
                n += b.count
                self._unindex(unit, slot, b.count, b.nbytes)
        self.stats["misses"] += 1
        self.stats["reloaded"] += n
        counters = self.m.counters
        counters.live += n
        if counters.live > counters.peak_live:
            counters.peak_live = counters.live
        if self.active:
            oldest = _oldest(st, self.chain)
            self.policy.touch(unit, now, 0.0, oldest if oldest is not None else now)

    def _index(self, unit: Unit, slot: int, count: int, nbytes: int, max_ts: int) -> None:
        slots = self.spilled.get(unit)
        if slots is None:
            slots = self.spilled[unit] = {}
            self.spilled_keys[unit[1]] = self.spilled_keys.get(unit[1], 0) + 1
        entry = slots.setdefault(slot, [0, 0, max_ts])
        entry[0] += count
        entry[1] += nbytes
        if max_ts > entry[2]:
            entry[2] = max_ts
        self.stats["pms_bytes"] += nbytes

    def _unindex(self, unit: Unit, slot: int, count: int, nbytes: int) -> None:
        slots = self.spilled.get(unit)
        if slots is None or slot not in slots:
            return
        entry = slots[slot]
        entry[0] -= count
        entry[1] -= nbytes
        self.stats["pms_bytes"] -= nbytes
        if entry[0] <= 0:
            del slots[slot]
        if not slots:
            del self.spilled[unit]
            left = self.spilled_keys[unit[1]] - 1
            if left:
                self.spilled_keys[unit[1]] = left
            else:
                del self.spilled_keys[unit[1]]


def _oldest(st: Any, chain: bool) -> int | None:
    """Creation time of a key's oldest resident partial match (its first event's ts)."""
    if chain:
        return min((d[0].event.ts for d in st.nodes if d), default=None)
    return min((r[0] for runs in st.by_slot for r in runs), default=None)
