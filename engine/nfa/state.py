"""Per-key NFA state shared by both storages: negation buffers and pending trailing negations.

A compiled plan holds no state (STYLE.md, Flink CEP's NFAState); the matcher
keeps one :class:`PlanState` subclass per (partition key, plan).
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Any, Final

from engine.events import Event
from engine.nfa.compiler import NegSpec, NFAPlan

_NEVER_TS: Final = -(1 << 62)  # fits an unboxed int of the compiled build; below every event time (MIN_TS_US)


def _fields(obj: object) -> tuple[str, ...]:
    """The instance attributes of a slotted class: ``__mypyc_attrs__`` when compiled (issue 45), else the slots."""
    cls = type(obj)
    names = getattr(cls, "__mypyc_attrs__", None)
    if names is None:
        names = tuple(n for k in cls.__mro__ for n in k.__dict__.get("__slots__", ()))
    return tuple(names)


def rebuild(cls: Any, args: tuple[Any, ...], fields: dict[str, Any]) -> Any:
    """Unpickle an engine state object: ``cls(*args)``, then ``fields`` set (``lace stream`` pickles per-key state;
    a compiled class's ``__new__`` runs ``__init__``, so the default slot pickling cannot rebuild it). A class with a
    ``restore_fields(fields)`` method sets them itself (it reads the fields of older pickles)."""
    obj = cls(*args)
    restore = getattr(obj, "restore_fields", None)
    if restore is not None:
        restore(fields)
        return obj
    for name, value in fields.items():
        setattr(obj, name, value)
    return obj


class Pending:
    """A complete match held until its trailing negations' deadline (``first.ts + window``)."""

    __slots__ = ("deadline", "last", "env", "plan", "killed")

    def __init__(self, deadline: int, last: Event, env: tuple[Any, ...], plan: NFAPlan) -> None:
        self.deadline = deadline
        self.last = last
        self.env = env
        self.plan = plan
        self.killed = False

    def __reduce__(self) -> tuple[Any, ...]:
        return rebuild, (Pending, (self.deadline, self.last, self.env, self.plan), {"killed": self.killed})


class PlanState:
    """Negation bookkeeping of one plan for one partition key.

    ``(neg_last_ts[k], neg_last_id[k])``: (ts_end, id) of the latest event that violates local-only negation k
    by itself (two int lists: the compiled build compares them unboxed, issue 45); ``neg_buf[k]``: the events of
    negation k's types, in order, for the negations whose conditions relate them to other variables;
    ``pending``: complete matches waiting for their trailing-negation deadline.
    """

    __slots__ = ("plan", "neg_last_ts", "neg_last_id", "neg_buf", "pending")

    def __init__(self, plan: NFAPlan) -> None:
        self.plan = plan
        self.neg_last_ts: list[int] = [_NEVER_TS] * len(plan.negations)
        self.neg_last_id: list[int] = [_NEVER_TS] * len(plan.negations)
        self.neg_buf: list[list[Event]] = [[] for _ in plan.negations]
        self.pending: list[Pending] = []

    def live(self) -> int:
        """Partial matches held in memory (overridden by each storage's state)."""
        return 0

    def init_args(self) -> tuple[Any, ...]:
        """The constructor's arguments of this state (pickling, :func:`rebuild`)."""
        return (self.plan,)

    def __reduce__(self) -> tuple[Any, ...]:
        fields = {name: getattr(self, name) for name in _fields(self) if name != "plan"}
        return rebuild, (type(self), self.init_args(), fields)

    def restore_fields(self, fields: dict[str, Any]) -> None:
        """Set the pickled ``fields`` (:func:`rebuild`); pickles made before issue 45 hold ``neg_last``, a list of
        (ts_end, id) tuples."""
        for name, value in fields.items():
            if name == "neg_last":
                self.neg_last_ts = [int(v[0]) for v in value]
                self.neg_last_id = [int(v[1]) for v in value]
            else:
                setattr(self, name, value)

    # ------------------------------------------------------------ recording
    def record_negations(self, e: Event) -> None:
        """Remember ``e`` for the middle negations whose types include it (after it was matched)."""
        for k, spec in enumerate(self.plan.negations):
            if e.type in spec.types:
                if spec.local_fns is not None:
                    if spec.qualifies_local(e):
                        self.neg_last_ts[k] = e.ts_end
                        self.neg_last_id[k] = e.id
                else:
                    self.neg_buf[k].append(e)

    def kill_pending(self, e: Event) -> None:
        """Drop pending matches that ``e`` (a trailing-negation event) violates."""
        keep = []
        for p in self.pending:
            if p.killed:
                continue
            if (p.last.ts_end, p.last.id) < (e.ts_end, e.id) and e.ts_end <= p.deadline:
                for spec in p.plan.trailing:
                    if e.type in spec.types and spec.violated_by(p.env, e):
                        p.killed = True
                        break
            if not p.killed:
                keep.append(p)
        self.pending = keep

    def trim(self, lower_ts: int) -> None:
        """Forget negation events older than ``lower_ts`` (no live partial match can need them)."""
        for buf in self.neg_buf:
            if buf and buf[0].ts_end < lower_ts:
                cut = 0
                while cut < len(buf) and buf[cut].ts_end < lower_ts:
                    cut += 1
                del buf[:cut]
        if self.pending:
            self.pending = [p for p in self.pending if not p.killed and p.deadline >= lower_ts]

    # ------------------------------------------------------------ checks
    def edge_negations_ok(self, specs: list[NegSpec], prev: Event, e: Event) -> bool:
        """Middle negations checkable on the edge ``prev -> e`` (local or edge form) hold."""
        for spec in specs:
            if spec.local_fns is not None:
                k = spec.k
                last_ts = self.neg_last_ts[k]
                if last_ts > prev.ts_end or (last_ts == prev.ts_end and self.neg_last_id[k] > prev.id):
                    return False
            elif spec.edge_fns is not None:
                for x in self._between(spec.k, prev, e):
                    if all(fn(prev, e, x) for fn in spec.edge_fns):
                        return False
        return True

    def general_negation_ok(self, spec: NegSpec, env: tuple[Any, ...]) -> bool:
        """A middle negation holds for the complete-enough binding ``env``: no buffered event of it strictly
        between the last event of slot ``spec.after`` and the first of the next violates it (buffer scan;
        ZStream's NSEQ test for tree plans). The buffer of a local-only negation holds only events that
        violate it by themselves: a tree plan records those there, the NFA none (it checks them on the
        edge, with ``neg_last``)."""
        plan = self.plan
        lo = env[spec.after][-1] if plan.slots[spec.after].kleene else env[spec.after]
        hi = env[spec.after + 1][0] if plan.slots[spec.after + 1].kleene else env[spec.after + 1]
        local = spec.local_fns is not None
        for x in self._between(spec.k, lo, hi):
            if local or spec.violated_by(env, x):
                return False
        return True

    def _between(self, k: int, lo: Event, hi: Event) -> list[Event]:
        buf = self.neg_buf[k]
        start = bisect_right(buf, (lo.ts_end, lo.id), key=lambda ev: (ev.ts_end, ev.id))
        out = []
        for x in buf[start:]:
            if (x.ts_end, x.id) >= (hi.ts_end, hi.id):
                break
            out.append(x)
        return out
