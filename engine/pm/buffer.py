"""The partial-match buffer (PMB): at most ``capacity`` partial matches in memory (DESIGN.md section 6).

After Peng et al., *Complex Event Processing over Live Archived Data Streams*
(001_e24f905c15fdf08b.txt, section 5, Procedure 1). The matcher calls :meth:`before`
for each event (so every partial match the event can touch is in memory: a **miss**
reloads it from the partial-match store, a **hit** finds it there) and :meth:`after`
(records the state updates for the spill policy and spills ``ΔR`` partial matches in
one batch when the buffer is over capacity).

Units (what the index on (partition key, NFA state) addresses):

- run storage: ``(plan, key, slot)``, the runs of one key waiting in one NFA state. An
  event only reads the states it can advance, so only those are reloaded;
- chain-partitioned storage: ``(plan, key, -1)``, the whole chain of a key (its nodes link
  to each other across states, so the chain is spilled and reloaded as a whole).

STPM's estimates (Definition 7), learnt online from the stream: ``Δt_i`` is the largest gap
seen between an ``E_i`` event and a later ``E_{i+1}`` event of the same key within the
window; ``p(E_{i+1} | E_i)`` is the fraction of ``E_i`` events that an ``E_{i+1}`` event of
the same key followed within the window.

Spilling never changes results: a unit is reloaded before any event that could read it,
and units of a key that still has spilled partial matches are never forgotten.
"""
from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import orjson

from engine.events import Event
from engine.pm.codec import decode_chain, decode_runs, encode_chain, encode_runs
from engine.pm.policy import Unit, make_policy
from engine.pm.store import MemoryStore, PartialMatchStore, SpilledBatch

if TYPE_CHECKING:
    from engine.matcher import Matcher


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
        Names the query's rows in the store; default the query's NAME or ``"query"``.

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
        self.active = False
        self.store: PartialMatchStore = store if store is not None else MemoryStore()
        self.query_id = query_id or matcher.query.name or "query"
        self.chain = matcher.storage == "chain"
        self.spilled: dict[Unit, int] = {}
        self.spilled_bytes: dict[Unit, int] = {}
        self.spilled_units_per_key: dict[Hashable, int] = {}
        self.keys: dict[str, Hashable] = {}
        self.stats = {"spilled": 0, "reloaded": 0, "hits": 0, "misses": 0, "expired": 0, "pms_bytes": 0}
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

    def before(self, key: Hashable, states: list[Any], e: Event) -> None:
        """Make every unit that ``e`` can read resident: each reload is a miss, an event needing none a hit."""
        if key not in self.spilled_units_per_key:
            self.stats["hits"] += 1
            return
        misses = self.stats["misses"]
        for p, (engine, st) in enumerate(zip(self.m.engines, states)):
            if self.chain:
                unit = (p, key, -1)
                if unit in self.spilled and e.type in engine.plan.slot_of_type:
                    self._load(unit, st, e.ts)
            else:
                for j in engine.visit.get(e.type, engine.default_visit):
                    unit = (p, key, j)
                    if unit in self.spilled:
                        self._load(unit, st, e.ts)
        if self.stats["misses"] == misses:
            self.stats["hits"] += 1

    def after(self, key: Hashable, states: list[Any], e: Event) -> None:
        """Record state updates for the policy (Procedure 1) and spill when over capacity.

        Until the buffer first fills, only STPM's statistics are kept (no priority records):
        :meth:`_activate` then ranks every resident unit by its newest partial match.
        """
        t = e.ts
        etype = e.type
        for p, st in enumerate(states):
            slots = self.slot_of_type[p].get(etype)
            if not slots:
                continue
            if self.learn:
                self._learn(p, key, slots, t)
            if self.active:
                self._touch(p, key, st, slots, e)
        if self.m.counters.live > self.capacity:
            if not self.active:
                self._activate()
            self._spill()

    def _touch(self, p: int, key: Hashable, st: Any, slots: tuple[int, ...], e: Event) -> None:
        touch = self.policy.touch
        t = e.ts
        for j in slots:
            if self.chain:
                d = st.nodes[j]
                if d and d[-1][0] is e:
                    touch((p, key, -1), t, self.weight(p, j), _chain_created(st))
            else:
                bucket = st.by_slot[j]
                if bucket:
                    run = bucket[-1]
                    bound = run[1][j]
                    if (bound[-1] if self.kleene[p][j] else bound) is e:
                        touch((p, key, j), t, self.weight(p, j), run[0])

    def _activate(self) -> None:
        """First fill: give every resident unit a priority record from its partial matches."""
        self.active = True
        touch = self.policy.touch
        for key, states in self.m.states.items():
            st: Any
            for p, st in enumerate(states):
                if self.chain:
                    newest = max(((d[-1][0].ts, j) for j, d in enumerate(st.nodes) if d), default=None)
                    if newest is not None:
                        touch((p, key, -1), newest[0], self.weight(p, newest[1]), _chain_created(st))
                else:
                    for j, bucket in enumerate(st.by_slot):
                        if bucket:
                            bound = bucket[-1][1][j]
                            last = bound[-1] if self.kleene[p][j] else bound
                            touch((p, key, j), last.ts, self.weight(p, j), min(r[0] for r in bucket))

    def forget_key(self, key: Hashable) -> None:
        """The matcher dropped an idle key's state: forget its units and statistics."""
        for p, kleene in enumerate(self.kleene):
            self.last_seen[p].pop(key, None)
            for j in (-1, *range(len(kleene))):
                self.policy.forget((p, key, j))

    def expire(self, lower_ts: int) -> None:
        """Delete spilled batches whose partial matches all left the window."""
        for b in self.store.delete_expired(self.query_id, lower_ts):
            unit = (b.plan, self.keys.get(b.key), b.slot)
            self._forget_spilled(unit, b.count, b.nbytes)
            self.stats["expired"] += b.count

    def discard_key(self, key: Hashable) -> None:
        """Drop every spilled partial match of ``key`` (strict contiguity: another key's event came)."""
        for unit in [u for u in self.spilled if u[1] == key]:
            for b in self.store.take(self.query_id, unit[0], encode_key(key), unit[2]):
                self._forget_spilled(unit, b.count, b.nbytes)

    def has_spilled(self, key: Hashable) -> bool:
        return key in self.spilled_units_per_key

    def spilled_count(self) -> int:
        return sum(self.spilled.values())

    def weight(self, p: int, j: int) -> float:
        """``Δt_j · p(E_{j+1} | E_j)`` in microseconds (0 for the last state)."""
        seen = self.seen[p][j]
        if not seen:
            return 0.0
        return self.max_gap[p][j] * min(1.0, self.followed[p][j] / seen)

    # ------------------------------------------------------------------ internals

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

    def _spill(self) -> None:
        # ΔR at a time; more when a reload overshot the capacity by more than that
        need = max(self.batch, self.m.counters.live - self.capacity)
        batches: list[SpilledBatch] = []
        counters = self.m.counters
        for unit in self.policy.victims():
            p, key, slot = unit
            states = self.m.states.get(key)
            self.policy.forget(unit)
            if states is None:
                continue
            st: Any = states[p]
            if self.chain:
                nodes = [list(d) for d in st.nodes]
                n = sum(len(d) for d in nodes)
                if not n:
                    continue
                payload = encode_chain(nodes)
                max_ts = max(node[0].ts for d in nodes for node in d)
                for d in st.nodes:
                    d.clear()
            else:
                runs = st.by_slot[slot]
                n = len(runs)
                if not n:
                    continue
                payload = encode_runs(runs, self.kleene[p])
                max_ts = max(r[0] for r in runs)
                st.by_slot[slot] = []
            ekey = encode_key(key)
            self.keys[ekey] = key
            batches.append(SpilledBatch(self.query_id, p, ekey, slot, n, max_ts, payload))
            if unit not in self.spilled:
                self.spilled_units_per_key[key] = self.spilled_units_per_key.get(key, 0) + 1
            self.spilled[unit] = self.spilled.get(unit, 0) + n
            self.spilled_bytes[unit] = self.spilled_bytes.get(unit, 0) + len(payload)
            self.stats["pms_bytes"] += len(payload)
            self.stats["spilled"] += n
            counters.live -= n
            need -= n
            if need <= 0:
                break
        if batches:
            self.store.write(batches)

    def _load(self, unit: Unit, st: Any, now: int) -> None:
        p, key, slot = unit
        batches = self.store.take(self.query_id, p, encode_key(key), slot)
        n = 0
        for b in batches:
            if self.chain:
                for j, nodes in enumerate(decode_chain(b.payload, len(st.nodes))):
                    st.nodes[j].extendleft(reversed(nodes))
            else:
                st.by_slot[slot] = decode_runs(b.payload, self.kleene[p]) + st.by_slot[slot]
            n += b.count
        self.stats["misses"] += 1
        self.stats["reloaded"] += n
        self.stats["pms_bytes"] -= self.spilled_bytes.pop(unit, 0)
        self._drop_unit(unit)
        counters = self.m.counters
        counters.live += n
        if counters.live > counters.peak_live:
            counters.peak_live = counters.live
        if self.chain:
            created = _chain_created(st)
        else:
            created = min(r[0] for r in st.by_slot[slot]) if st.by_slot[slot] else now
        self.policy.touch(unit, now, self.weight(p, max(slot, 0)), created)

    def _forget_spilled(self, unit: Unit, count: int, nbytes: int) -> None:
        left = self.spilled.get(unit, 0) - count
        self.stats["pms_bytes"] -= nbytes
        if left > 0:
            self.spilled[unit] = left
            self.spilled_bytes[unit] = self.spilled_bytes.get(unit, 0) - nbytes
        else:
            self.spilled_bytes.pop(unit, None)
            self._drop_unit(unit)

    def _drop_unit(self, unit: Unit) -> None:
        if self.spilled.pop(unit, None) is not None:
            key = unit[1]
            left = self.spilled_units_per_key[key] - 1
            if left:
                self.spilled_units_per_key[key] = left
            else:
                del self.spilled_units_per_key[key]


def _chain_created(st: Any) -> int:
    """Creation time of a chain's oldest partial match: the ts of its oldest node's event."""
    return min((d[0][0].ts for d in st.nodes if d), default=0)
