"""The rule index (engine/rules/index.py): the statements an event reaches equal a linear scan's.

- Random statement sets (every statement kind, every selection strategy, Kleene and negated
  components, constant equalities and ranges on both sides of the operator, residual conjuncts) and
  events at the range bounds (equal, inclusive/exclusive, missing attributes, strings vs numbers, bools,
  floats vs ints, NaN, huge ints, unhashable values), with statements added and removed in between:
  ``reached`` equals the index's own linear scan and an independent reference written here with the
  test oracle's condition evaluator (tests/engine/oracle.py ``truth``).
- The pattern suite (tests/engine/patterns.py cases, the matcher): feeding a query only the events
  the index says reach it gives the same matches as feeding it every event.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings

from engine.compiler import compile_query
from engine.events import Event
from engine.lql import ast as A
from engine.lql.checks import conjuncts
from engine.matcher import Matcher
from engine.rules.index import RuleIndex, single_variable_conjuncts, statement_entries
from tests.engine.oracle import truth
from tests.engine.patterns import Case, cases, cmp, lit, neg, plus, query, ref, seq, single, star

S = 1_000_000
TYPES = "ABC"
ATTRS = ("x", "y", "s")
# values at and around the constants below: equal, just inside/outside, other numeric types, strings
VALUES = (0, 1, 1.0, True, False, 2, 2.0, 2.5, 3, -1, 0.5, 1e-9, 10**20, "A", "B", "1", "", float("nan"), float("inf"))
CONSTANTS = (0, 1, 1.0, True, False, 2, 2.5, -1, 3, "A", "B", "1")
OPS = ("=", "!=", "<", "<=", ">", ">=")
STRATEGIES = A.STRATEGIES


# --------------------------------------------------------------------------- independent reference


def _refs(e: A.Expr):
    if isinstance(e, (A.AttrRef, A.Aggregate, A.Equivalence)):
        yield e
    elif isinstance(e, A.BoolOp):
        for o in e.operands:
            yield from _refs(o)
    elif isinstance(e, (A.Not, A.Neg)):
        yield from _refs(e.operand)
    elif isinstance(e, (A.BinOp, A.Compare)):
        yield from _refs(e.left)
        yield from _refs(e.right)


def _mine(where: A.Expr | None, var: str, kleene: bool) -> list[A.Expr]:
    if where is None:
        return []
    out = []
    for c in conjuncts(where):
        refs = list(_refs(c))
        ok = bool(refs)
        for r in refs:
            if not isinstance(r, A.AttrRef) or r.var != var:
                ok = False
            elif kleene and (r.index is None or r.index.kind != "i"):
                ok = False
            elif not kleene and r.index is not None:
                ok = False
        if ok:
            out.append(c)
    return out


def _holds(conj: list[A.Expr], var: str, kleene: bool, event: Event) -> bool:
    binding = {var: (event,) if kleene else event}
    return all(truth(c, binding, 1 if kleene else None) for c in conj)


def reference(statements: dict[str, object], event: Event) -> list[str]:
    """The ids reached by ``event`` written from the rules of docs/semantics.md, not from the index."""
    out = []
    for sid, q in statements.items():
        if isinstance(q, A.LiveArchivedQuery):
            q = q.live
        if isinstance(q, A.PatternQuery):
            comps = A.components(q.pattern)
            if q.strategy in ("strict_contiguity", "partition_contiguity"):
                hit = any(event.type in c.types for c in comps)
            else:
                hit = any(
                    event.type in c.types and _holds(_mine(q.where, c.var, c.is_kleene), c.var, c.is_kleene, event)
                    for c in comps
                )
        elif isinstance(q, A.AggregateQuery):
            hit = event.type == q.type and _holds(_mine(q.where, q.var, False), q.var, False, event)
        else:  # FILTER rules and unknown kinds: every event of their type
            hit = event.type == getattr(q, "type", None)
        if hit:
            out.append(sid)
    return out


# --------------------------------------------------------------------------- random statements and events


@dataclass(frozen=True)
class IntervalStatement:
    """A statement kind the index does not know (as an INTERVAL statement would be): always reached."""

    type: str
    name: str | None = None
    emit_into: str | None = None


def _const(rng: random.Random) -> A.Expr:
    r = rng.random()
    if r < 0.08:
        return A.Neg(lit(rng.choice((1, 2.5))))
    if r < 0.14:
        return A.BinOp("+", lit(1), lit(rng.choice((1, 0.5))))
    if r < 0.17:
        return A.BinOp("/", lit(1), lit(0))  # folds to missing: never a path, always false
    return lit(rng.choice(CONSTANTS))


def _conjunct(rng: random.Random, var: str, kleene: bool, others: list[str]) -> A.Expr:
    idx = "i" if kleene else None
    r = ref(var, rng.choice(ATTRS), idx)
    kind = rng.random()
    op = rng.choice(OPS)
    if kind < 0.55:
        c = _const(rng)
        return cmp(op, r, c) if rng.random() < 0.7 else cmp(op, c, r)
    if kind < 0.62:
        return cmp(op, A.BinOp("-", r, lit(2)), rng.choice(CONSTANTS))  # ("s" * 2 repeats a string)
    if kind < 0.68:
        return A.BoolOp("or", (cmp(op, r, rng.choice(CONSTANTS)), cmp("=", ref(var, "y", idx), 1)))
    if kind < 0.72:
        return A.Not(cmp(op, r, rng.choice(CONSTANTS)))
    if kind < 0.78 and others:
        return cmp(op, r, ref(rng.choice(others), "x"))  # two variables: not an index conjunct
    if kind < 0.82 and kleene:
        return cmp(op, ref(var, "x", "1"), 1)  # b[1]: not a per-element conjunct
    if kind < 0.86 and kleene:
        return cmp("<", ref(var, "x", "i"), ref(var, "x", "i-1"))
    if kind < 0.88:
        return A.Equivalence("x")
    return cmp(op, ref(var, "x", idx), ref(var, "y", idx))  # same variable, two attributes: residual


def _band(rng: random.Random, var: str, kleene: bool) -> list[A.Expr]:
    """A two-sided range ``lo <(=) v.x <(=) hi`` (numeric bounds)."""
    idx = "i" if kleene else None
    lo = rng.choice((0, 0.5, 1, 1.0, True, 2, -1))
    hi = rng.choice((0, 1, 2, 2.5, 3, 1.0))
    return [cmp(rng.choice((">", ">=")), ref(var, "x", idx), lo), cmp(rng.choice(("<", "<=")), ref(var, "x", idx), hi)]


def random_statement(rng: random.Random) -> object:
    r = rng.random()
    if r < 0.05:
        return A.FilterRule(rng.choice(TYPES), "f")
    if r < 0.08:
        return IntervalStatement(rng.choice(TYPES))
    if r < 0.18:
        parts = []
        for _ in range(rng.randint(0, 3)):
            parts.append(_conjunct(rng, "v", False, []))
        if rng.random() < 0.4:
            parts += _band(rng, "v", False)
        where = None if not parts else parts[0] if len(parts) == 1 else A.BoolOp("and", tuple(parts))
        return A.AggregateQuery(rng.choice(TYPES), "v", A.WindowSpec("tumbling", S, S), (), where=where)
    pq = random_pattern(rng)
    if r < 0.28:
        archived = query(seq(single(rng.choice(TYPES), "z")), cmp(">", ref("z", "x"), 1))
        return A.LiveArchivedQuery(pq, archived, 10 * S, cmp("=", ref(pq_var(pq), "x"), ref("z", "x")))
    return pq


def pq_var(q: A.PatternQuery) -> str:
    return next(c.var for c in A.components(q.pattern) if c.kind == "single" or c.is_kleene)


def random_pattern(rng: random.Random) -> A.PatternQuery:
    names = iter("abcdefgh")
    items: list[A.PatternNode] = [single(rng.choice(TYPES) if rng.random() < 0.8 else "AB", next(names))]
    for _ in range(rng.randint(0, 2)):
        k = rng.random()
        t = rng.choice(TYPES)
        if k < 0.4:
            items.append(single(t, next(names)))
        elif k < 0.6:
            items.append(plus(t, next(names)))
        elif k < 0.7:
            items.append(star(t, next(names)))
        else:
            items.append(neg(t, next(names)))
    comps = A.components(seq(*items))
    parts: list[A.Expr] = []
    for c in comps:
        others = [o.var for o in comps if o.var != c.var and o.kind == "single"]
        for _ in range(rng.choice((0, 1, 1, 2, 3))):
            parts.append(_conjunct(rng, c.var, c.is_kleene, others))
        if rng.random() < 0.3:
            parts += _band(rng, c.var, c.is_kleene)
    rng.shuffle(parts)
    where = None if not parts else parts[0] if len(parts) == 1 else A.BoolOp("and", tuple(parts))
    strategy = rng.choice(STRATEGIES) if rng.random() < 0.3 else "skip_till_any_match"
    within = 10 if any(c.kind == "neg" for c in comps) else None
    return query(seq(*items), where, strategy=strategy, within_s=within)


def random_event(rng: random.Random, k: int) -> Event:
    attrs: dict[str, object] = {}
    for a in ATTRS:
        if rng.random() < 0.8:
            attrs[a] = rng.choice(VALUES)
    if rng.random() < 0.03:
        attrs["x"] = [1]  # unhashable and incomparable: every comparison false, != true
    return Event(k, rng.choice(TYPES + "D"), k * S, attrs)


def _agree(index: RuleIndex, statements: dict[str, object], event: Event) -> None:
    got = index.reached(event)
    assert got == index.scan(event), event
    assert got == reference(statements, event), event


@pytest.mark.parametrize("seed", range(40))
def test_reached_equals_linear_scan_with_adds_and_removes(seed: int) -> None:
    rng = random.Random(seed)
    index = RuleIndex()
    live: dict[str, object] = {}
    counter = 0
    for _step in range(60):
        r = rng.random()
        if r < 0.35 or not live:
            sid = f"q{counter}"
            counter += 1
            q = random_statement(rng)
            index.add(sid, q)
            live[sid] = q
        elif r < 0.5:
            sid = rng.choice(list(live))
            index.remove(sid)
            del live[sid]
        for k in range(15):
            _agree(index, live, random_event(rng, k))
    # removing everything leaves an empty index
    for sid in list(live):
        index.remove(sid)
    assert index.stats()["types"] == {}
    assert index.reached(random_event(rng, 1)) == []


def test_reached_was_not_vacuous() -> None:
    """The random sets above reach some statements and skip others (the assertions could fail)."""
    rng = random.Random(7)
    index = RuleIndex()
    live = {}
    for k in range(60):
        q = random_statement(rng)
        index.add(f"q{k}", q)
        live[f"q{k}"] = q
    sizes = [len(index.reached(random_event(rng, k))) for k in range(300)]
    assert min(sizes) < max(sizes)
    assert 0 < sum(sizes) < 300 * len(live)


# --------------------------------------------------------------------------- the rules at bounds, one by one


def _pattern(where: A.Expr | None, strategy: str = "skip_till_any_match") -> A.PatternQuery:
    return query(seq(single("A", "a")), where, strategy=strategy)


def _ev(**attrs: object) -> Event:
    return Event(1, "A", 0, dict(attrs))


@pytest.mark.parametrize(
    ("op", "const", "value", "expected"),
    [
        (">", 1, 1, False),
        (">=", 1, 1, True),
        (">=", 1, 1.0, True),
        (">=", 1, True, True),
        ("<", 1, 0.999, True),
        ("<", 1, 1.0, False),
        ("<=", 1.0, 1, True),
        ("<", 1, "0", False),  # string vs number: false
        (">", "A", "B", True),
        (">", "A", 2, False),
        ("=", 1, True, True),  # 1 == True (one hash)
        ("=", 1, 1.0, True),
        ("=", True, 1.0, True),
        ("=", 1, "1", False),
        ("=", "1", "1", True),
        ("=", 2, None, False),  # missing
        (">", 2, None, False),
        ("!=", 1, "1", True),  # != between a string and a number is true
        ("!=", 1, None, False),
        ("=", 1, float("nan"), False),
        (">", 1, float("nan"), False),
        ("<", 1, float("-inf"), True),
    ],
)
def test_a_single_bound(op: str, const: object, value: object, expected: bool) -> None:
    index = RuleIndex()
    index.add("q", _pattern(cmp(op, ref("a"), const)))
    index.add("mirrored", _pattern(cmp({"<": ">", ">": "<", "<=": ">=", ">=": "<="}.get(op, op), lit(const), ref("a"))))
    event = _ev() if value is None else _ev(x=value)
    assert index.reached(event) == (["q", "mirrored"] if expected else [])


@pytest.mark.parametrize(
    ("lo_op", "hi_op", "value", "expected"),
    [
        (">=", "<", 10, True),
        (">", "<", 10, False),
        (">=", "<", 20, False),
        (">=", "<=", 20, True),
        (">=", "<=", 20.0, True),
        (">=", "<", 19.999999999999996, True),
        (">=", "<", 9.999999999999998, False),
        (">=", "<", "15", False),
    ],
)
def test_a_two_sided_band(lo_op: str, hi_op: str, value: object, expected: bool) -> None:
    index = RuleIndex()
    index.add("wide", _pattern(A.BoolOp("and", (cmp(">=", ref("a"), -1000), cmp("<", ref("a"), 1000)))))
    band = A.BoolOp("and", (cmp(lo_op, ref("a"), 10), cmp(hi_op, ref("a"), 20)))
    index.add("band", _pattern(band))
    assert index.reached(_ev(x=value)) == (["wide", "band"] if expected else ["wide"] if value != "15" else [])


def test_float_band_edges_are_found() -> None:
    """Bands with float bounds next to each other: the widest-band window never misses a lower bound."""
    index = RuleIndex()
    bounds = [round(0.1 * k, 10) for k in range(50)]
    for k in range(49):
        where = A.BoolOp("and", (cmp(">=", ref("a"), bounds[k]), cmp("<", ref("a"), bounds[k + 1])))
        index.add(f"b{k}", _pattern(where))
    for value in [*bounds, *(b + 1e-12 for b in bounds), *(b - 1e-12 for b in bounds), 0.30000000000000004]:
        event = _ev(x=value)
        assert index.reached(event) == index.scan(event)
        assert len(index.reached(event)) == (1 if 0 <= value < bounds[-1] else 0)


def test_which_statements_are_always_reached() -> None:
    index = RuleIndex()
    never = cmp("=", ref("a"), "never")
    index.add("strict", _pattern(never, "strict_contiguity"))
    index.add("partition", _pattern(never, "partition_contiguity"))
    index.add("next", _pattern(never, "skip_till_next_match"))
    index.add("filter", A.FilterRule("A", "f", drop_when=never))
    index.add("interval", IntervalStatement("A"))
    index.add("aggregate", A.AggregateQuery("A", "v", A.WindowSpec("tumbling", S, S), (), where=cmp(">", ref("v"), 5)))
    assert index.reached(_ev(x=1)) == ["strict", "partition", "filter", "interval"]
    assert index.reached(_ev(x=6)) == ["strict", "partition", "filter", "interval", "aggregate"]
    assert index.reached(Event(1, "B", 0, {"x": 6})) == []


def test_negated_and_kleene_components_have_entries() -> None:
    index = RuleIndex()
    where = A.BoolOp(
        "and",
        (
            cmp("=", ref("a"), 1),
            cmp(">", ref("b", "x", "i"), 5),  # per element of b
            cmp("<", ref("b", "y", "1"), 0),  # b[1] only: not an entry condition
            cmp("=", ref("n", "s"), "stop"),  # the negating event
        ),
    )
    q = query(seq(single("A", "a"), plus("B", "b"), neg("C", "n")), where, within_s=5)
    index.add("q", q)
    always, specs = statement_entries(q)
    assert always == frozenset()
    assert {(s.type, s.var, len(s.conjuncts)) for s in specs} == {("A", "a", 1), ("B", "b", 1), ("C", "n", 1)}
    assert index.reached(Event(1, "B", 0, {"x": 6, "y": 3})) == ["q"]
    assert index.reached(Event(1, "B", 0, {"x": 5})) == []
    assert index.reached(Event(1, "C", 0, {"s": "stop"})) == ["q"]
    assert index.reached(Event(1, "C", 0, {"s": "go"})) == []


def test_live_and_archived_indexes_its_live_side_only() -> None:
    live = query(seq(single("A", "a")), cmp(">", ref("a"), 3))
    archived = query(seq(single("B", "z")), None)
    index = RuleIndex()
    index.add("la", A.LiveArchivedQuery(live, archived, 60 * S, cmp("=", ref("a"), ref("z"))))
    assert index.reached(_ev(x=4)) == ["la"]
    assert index.reached(_ev(x=3)) == []
    assert index.reached(Event(2, "B", 0, {"x": 4})) == []


def test_single_variable_conjuncts() -> None:
    where = A.BoolOp(
        "and",
        (
            cmp("=", ref("a"), 1),
            cmp("<", ref("a"), ref("b")),
            cmp(">", ref("b", "x", "i"), ref("b", "x", "i-1")),
            cmp(">", ref("b", "x", "i"), 2),
            A.Equivalence("k"),
            lit(True),
        ),
    )
    assert single_variable_conjuncts(where, "a") == [where.operands[0]]
    assert single_variable_conjuncts(where, "b", kleene=True) == [where.operands[3]]


def test_unhashable_and_exotic_values_are_checked_not_skipped() -> None:
    index = RuleIndex()
    index.add("eq", _pattern(cmp("=", ref("a"), 1)))
    index.add("ne", _pattern(cmp("!=", ref("a"), 1)))
    index.add("lt", _pattern(cmp("<", ref("a"), 1)))
    for value in ([1], {"k": 1}, (0,), b"\x00"):
        event = _ev(x=value)
        assert index.reached(event) == index.scan(event) == reference(index_statements(index), event)


def index_statements(index: RuleIndex) -> dict[str, object]:
    names = {"eq": "=", "ne": "!=", "lt": "<"}
    return {sid: _pattern(cmp(op, ref("a"), 1)) for sid, op in names.items() if sid in index}


def test_add_and_remove_errors_and_stats() -> None:
    index = RuleIndex()
    index.add("q", _pattern(A.BoolOp("and", (cmp("=", ref("a", "k"), "s1"), cmp(">", ref("a"), 2)))))
    with pytest.raises(ValueError, match="already"):
        index.add("q", _pattern(None))
    with pytest.raises(KeyError):
        index.remove("nope")
    index.reached(_ev(k="s1", x=3))
    stats = index.stats()
    assert stats["statements"] == 1 and stats["entries"] == 1
    assert stats["types"]["A"]["hash_levels"] == 1 and stats["types"]["A"]["range_entries"] == 1
    assert stats["reached_per_event"] == 1.0
    index.remove("q")
    assert index.stats()["types"] == {}


# --------------------------------------------------------------------------- the pattern suite, index on and off


def _run(text: str, events: list[Event]) -> set:
    m = Matcher(compile_query(text))
    out = []
    for e in events:
        out += m.push(e)
    out += m.flush()
    return {x.key() for x in out}


HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


@settings(max_examples=400, deadline=None, suppress_health_check=HEALTH)
@given(case=cases(min_conjuncts=1))
def test_pattern_suite_with_the_index_on_and_off(case: Case) -> None:
    index = RuleIndex()
    index.add("q", case.query)
    reached = [e for e in case.events if index.reached(e) == ["q"]]
    assert _run(case.text, reached) == _run(case.text, case.events), case.describe()


@settings(max_examples=200, deadline=None, suppress_health_check=HEALTH)
@given(case=cases(strategies=("skip_till_next_match",), min_events=10, min_conjuncts=1))
def test_skip_till_next_match_with_the_index_on_and_off(case: Case) -> None:
    index = RuleIndex()
    index.add("q", case.query)
    reached = [e for e in case.events if index.reached(e) == ["q"]]
    assert _run(case.text, reached) == _run(case.text, case.events), case.describe()


# --------------------------------------------------------------------------- in the rule graph


@pytest.mark.parametrize("seed", range(4))
def test_rule_graph_gives_the_same_results_with_the_index(seed: int) -> None:
    from engine.detector import compile_statement
    from engine.lql.parser import parse_script
    from engine.rules.graph import RuleGraph
    from tests.rules.test_graph import CAPTURE_THEN_PATTERN, _stream

    def run(router: RuleIndex | None) -> list:
        graph = RuleGraph(router=router)
        graph.index_min = 0  # consult the index for every event (the default skips it for a few readers)
        for q in parse_script(CAPTURE_THEN_PATTERN):
            graph.add(q.name or "q", compile_statement(q))
        out = []
        for e in _stream(400, seed):
            if graph.filter(e) is None:
                out.extend(graph.push(e))
        out.extend(graph.flush())
        return sorted((name, tuple(sorted(m.ids().items())), m.start, m.end) for name, m in out)

    index = RuleIndex()
    with_index = run(index)
    assert with_index == run(None)
    for batch in (1, 50):  # the service's batched path
        assert _batched(index_min=0, batch=batch, seed=seed) == _batched(index_min=10**9, batch=batch, seed=seed)
    assert with_index
    stats = index.stats()
    assert stats["statements"] == 3  # filters run before the index, not through it
    assert 0 < stats["reached_per_event"] < 2  # some events were kept from some statements


def _batched(*, index_min: int, batch: int, seed: int) -> list:
    from engine.detector import compile_statement
    from engine.lql.parser import parse_script
    from engine.rules.graph import RuleGraph
    from tests.rules.test_graph import CAPTURE_THEN_PATTERN, _stream

    graph = RuleGraph(router=RuleIndex(), auto_advance=False)
    graph.index_min = index_min
    for q in parse_script(CAPTURE_THEN_PATTERN):
        graph.add(q.name or "q", compile_statement(q))
    events = _stream(400, seed)
    out = []
    for i in range(0, len(events), batch):
        kept = [e for e in events[i : i + batch] if graph.filter(e) is None]
        out.extend(graph.push_batch(kept))
        if kept:
            wm = kept[-1].ts - 1
            out.extend(graph.advance(wm, lambda types, wm=wm: wm))
    out.extend(graph.flush())
    return sorted((name, tuple(sorted(m.ids().items())), m.start, m.end) for name, m in out)
