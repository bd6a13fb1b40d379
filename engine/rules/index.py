"""The rule index shared by all statements: which statements can an event affect?

003 (the CQ index: rules inserted, deleted and searched while the stream runs); issue 14 "The rule
index"; the layout is Esper's filter service (per event type, a tree of filter-parameter indexes:
equality by hash, ranges by sorted bounds, the rest in a residual list verified one by one).

**Entries.** A statement has an entry per (component variable, event type the variable reads): the
conjunction of the variable's *single-variable conjuncts* of WHERE (the top-level AND parts that
reference only that variable: ``v.attr``, or for a Kleene variable only ``v[i].attr``). Each is a
necessary condition for binding an event to the variable (docs/semantics.md sections 3 and 5: a
single-variable conjunct must hold for the event bound to ``v``, for every element of ``v[]``, and for a
negating event). An event *reaches* a statement when one of the statement's entries for the event's
type is satisfied; an event that reaches no entry of a statement could bind none of its variables, so
dropping it changes none of its matches (docs/semantics.md "Which statements an event reaches").

**Always reached** (every event of the statement's types): strict and partition contiguity (an event
of their types breaks runs), FILTER rules, statements of kinds this module does not know (e.g. interval
derivation). A live-and-archived query is indexed by its LIVE side only (its ARCHIVED side reads the
archive, not the live stream). An AGGREGATE statement is indexed by its WHERE.

**Exactness.** Every candidate an access path yields is verified with the entry's whole conjunction
compiled by :func:`engine.nfa.conditions.compile_bool` (the matcher's null rules: a missing value or
incomparable types make a comparison false). Access paths only need to return a superset of the
entries whose path conjunct holds: equality by a Python hash lookup (``1 == 1.0 == True`` share a hash,
so a value of another numeric type is still found, and verified), ranges by bisection in one sorted
list per comparable class (numbers and bools; strings), a missing value or NaN reaching no equality or
range entry (every comparison with it is false), and a value of any other type (unhashable, not
comparable) checking every entry of the index it would have used. :meth:`RuleIndex.scan` is the linear
scan the index must agree with.

**Access path per entry** (most selective first): the entry walks down one hash level per constant
equality ``v.a = c`` (attributes in name order, so entries that share attributes share levels, as in
Esper's filter-parameter tree), then it is stored in a range index under a constant range on one
attribute (two-sided ``lo <(=) v.a <(=) hi`` before one-sided), else in the node's residual list.
A two-sided numeric range is found by bisecting its lower bound within ``[x - widest range, x]``
(Esper's range index).

Timestamps (``v.ts``) are int microseconds UTC like everywhere else.

The entries of a statement and their access paths are :mod:`engine.rules.index_entries`, the tree of hash
levels, range indexes and residual lists :mod:`engine.rules.index_tree`; this module keeps the index of every
statement, its changes and its lookups.
"""
from __future__ import annotations

import itertools
from typing import Any

from engine.events import Event, attr_getter
from engine.lql import ast
from engine.nfa.conditions import Fn, compile_bool
from engine.rules.index_entries import (
    CONTIGUOUS,
    EntrySpec,
    _choose_range,
    _path_conjunct,
    entry_resolver,
    single_variable_conjuncts,
    statement_entries,
)
from engine.rules.index_tree import _Entry, _kind, _Node, _Ranges, _Statement, _tree_stats, _TypeIndex, _width


class RuleIndex:
    """Which statements an event can affect (module docstring; Esper's filter service, 003's CQ index).

    ``add(statement_id, query_ast)`` and ``remove(statement_id)`` change it at any time (cost: one walk
    down the tree per entry, O(log n) per sorted insert); ``reached(event)`` gives the statement ids,
    in insertion order, that ``event`` reaches. ``scan(event)`` is the linear scan it always equals.

    Raises
    ------
    ValueError
        From :meth:`add` for an id already indexed.
    KeyError
        From :meth:`remove` for an unknown id.
    """

    def __init__(self) -> None:
        self._types: dict[str, _TypeIndex] = {}
        self._statements: dict[str, _Statement] = {}
        self._by_seq: dict[int, str] = {}
        self._seq = itertools.count()
        self._uid = itertools.count()
        self.events = 0
        self.candidates = 0
        self.reached_total = 0

    def __len__(self) -> int:
        return len(self._statements)

    def __contains__(self, statement_id: object) -> bool:
        return statement_id in self._statements

    # ------------------------------------------------------------------ changes

    def add(self, statement_id: str, query_ast: Any) -> None:
        """Index a statement (any syntax tree of :mod:`engine.lql.ast`, or an unknown kind: always reached).

        Raises
        ------
        ValueError
            When ``statement_id`` is already indexed.
        """
        if statement_id in self._statements:
            raise ValueError(f"statement '{statement_id}' is already in the rule index")
        seq = next(self._seq)
        always, specs = statement_entries(query_ast)
        entries = [self._add_entry(statement_id, seq, spec) for spec in specs]
        for t in always:
            ti = self._types.setdefault(t, _TypeIndex())
            ti.always[seq] = ti.always.get(seq, 0) + 1
        self._statements[statement_id] = _Statement(statement_id, seq, always, entries)
        self._by_seq[seq] = statement_id

    def remove(self, statement_id: str) -> None:
        """Remove a statement and all its entries.

        Raises
        ------
        KeyError
            For an id not in the index.
        """
        st = self._statements.pop(statement_id)
        del self._by_seq[st.seq]
        for t in st.always_types:
            ti = self._types[t]
            n = ti.always.pop(st.seq) - 1
            if n:
                ti.always[st.seq] = n
            self._drop_if_empty(t)
        for entry in st.entries:
            self._remove_entry(entry)

    def _add_entry(self, sid: str, seq: int, spec: EntrySpec) -> _Entry:
        conj = spec.conjuncts
        check: Fn | None = None
        if conj:
            expr = conj[0] if len(conj) == 1 else ast.BoolOp("and", conj)
            check = compile_bool(expr, entry_resolver(spec.var, spec.kleene))
        entry = _Entry(sid, seq, next(self._uid), spec.type, spec.var, check)
        ti = self._types.setdefault(spec.type, _TypeIndex())
        ti.entries += 1
        if check is None:  # no condition: the statement is reached by every event of the type
            ti.always[seq] = ti.always.get(seq, 0) + 1
            entry.place = ("always",)
            return entry
        paths = [p for p in (_path_conjunct(c, spec.var, spec.kleene) for c in conj) if p is not None]
        eqs = sorted(((a, v) for a, op, v in paths if op == "="), key=lambda av: av[0])
        node = ti.root
        node.size += 1
        for attr, value in eqs:
            slot = node.eq.get(attr)
            if slot is None:
                slot = node.eq[attr] = (attr_getter(attr), {})
            child = slot[1].get(value)
            if child is None:
                child = slot[1][value] = _Node()
            entry.path.append((node, attr, value))
            node = child
            node.size += 1
        ranges = [p for p in paths if p[1] != "="]
        if not ranges:
            node.residual.append(entry)
            entry.place = ("residual", node)
            return entry
        attr, lo, hi = _choose_range(ranges)
        rng = node.ranges.get(attr)
        if rng is None:
            rng = node.ranges[attr] = _Ranges(attr)
        rng.size += 1
        if lo is not None and hi is not None:
            width = _width(lo, hi)
            entry.place = ("both", node, attr, lo, width)
            rng.add_both(lo, width, entry)
        elif lo is not None:
            entry.place = ("lower", node, attr, lo, _kind(lo))
            rng.lower[_kind(lo)].add(lo, entry)  # type: ignore[index]
        else:
            entry.place = ("upper", node, attr, hi, _kind(hi))
            rng.upper[_kind(hi)].add(hi, entry)  # type: ignore[index]
        return entry

    def _remove_entry(self, entry: _Entry) -> None:
        ti = self._types[entry.type]
        ti.entries -= 1
        kind = entry.place[0]
        if kind == "always":
            n = ti.always.pop(entry.seq) - 1
            if n:
                ti.always[entry.seq] = n
            self._drop_if_empty(entry.type)
            return
        node = entry.place[1]
        if kind == "residual":
            node.residual.remove(entry)
        else:
            attr, bound = entry.place[2], entry.place[3]
            rng = node.ranges[attr]
            if kind == "both":
                rng.remove_both(bound, entry.place[4], entry)
            elif kind == "lower":
                rng.lower[entry.place[4]].remove(bound, entry)
            else:
                rng.upper[entry.place[4]].remove(bound, entry)
            rng.size -= 1
            if not rng.size:
                del node.ranges[attr]
        # walk back up the hash levels, pruning emptied nodes
        node.size -= 1
        for parent, attr, value in reversed(entry.path):
            if not node.size:
                table = parent.eq[attr][1]
                del table[value]
                if not table:
                    del parent.eq[attr]
            node = parent
            node.size -= 1
        self._drop_if_empty(entry.type)

    def _drop_if_empty(self, type_name: str) -> None:
        ti = self._types[type_name]
        if not ti.entries and not ti.always:
            del self._types[type_name]

    # ------------------------------------------------------------------ lookups

    def reached(self, event: Event) -> list[str]:
        """The ids of the statements ``event`` can affect, in insertion order (equal to :meth:`scan`)."""
        self.events += 1
        ti = self._types.get(event.type)
        if ti is None:
            return []
        hit = set(ti.always)
        if ti.root.size:
            out: list[_Entry] = []
            ti.root.collect(event, out)
            self.candidates += len(out)
            for entry in out:
                if entry.seq not in hit and entry.check(event, None, None):  # type: ignore[misc]
                    hit.add(entry.seq)
        self.reached_total += len(hit)
        by_seq = self._by_seq
        return [by_seq[s] for s in sorted(hit)]

    def scan(self, event: Event) -> list[str]:
        """The linear scan :meth:`reached` must equal: every statement, every entry's whole conjunction."""
        out = []
        for st in self._statements.values():
            if event.type in st.always_types:
                out.append(st.sid)
                continue
            for entry in st.entries:
                if entry.type == event.type and (entry.check is None or entry.check(event, None, None)):
                    out.append(st.sid)
                    break
        return out

    def stats(self) -> dict[str, Any]:
        """Counters (JSON-ready): statements, entries, always-reached statements per type, tree sizes, and
        per event looked up: candidates verified and statements reached (means)."""
        per_type: dict[str, Any] = {}
        for t, ti in self._types.items():
            nodes, hashed, ranged, residual = _tree_stats(ti.root)
            per_type[t] = {
                "entries": ti.entries,
                "always": len(ti.always),
                "nodes": nodes,
                "hash_levels": hashed,
                "range_entries": ranged,
                "residual_entries": residual,
            }
        n = max(self.events, 1)
        return {
            "statements": len(self._statements),
            "entries": sum(len(s.entries) for s in self._statements.values()),
            "types": per_type,
            "events": self.events,
            "candidates_per_event": self.candidates / n,
            "reached_per_event": self.reached_total / n,
        }


__all__ = ["CONTIGUOUS", "EntrySpec", "RuleIndex", "entry_resolver", "single_variable_conjuncts", "statement_entries"]
