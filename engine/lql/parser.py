"""LQL text -> syntax tree (:mod:`engine.lql.ast`), then the semantic checks.

The grammar lives in ``grammar.lark`` and is parsed with lark's LALR(1) parser and contextual
lexer. Query text is only ever tokenized and parsed: nothing is evaluated with ``eval``/``exec``.
Every syntax error and every failed check becomes a :class:`QueryError` with the 1-based line and
column of the offending token and a one-line reason.

The syntax tree is built by :class:`_ToAst`: the pattern statements (``PATTERN ...``, ``LIVE ... ARCHIVED ...``)
and the statement wrapper (NAME, EMIT INTO) here, over the builders of :mod:`engine.lql.build_rules` (FILTER,
AGGREGATE, INTERVAL) and :mod:`engine.lql.build_exprs` (expressions) and the shared clauses of
:mod:`engine.lql.build_common`; syntax errors are worded by :mod:`engine.lql.syntax_errors`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from lark import Lark, Token, Tree, v_args
from lark.exceptions import UnexpectedInput, VisitError
from lark.tree import Meta

from engine.lql import ast
from engine.lql.build_common import _DURATION_HINT, _clauses, _first_child, _pos
from engine.lql.build_exprs import _ExprBuilders, _installed, _plugin
from engine.lql.build_rules import _RuleBuilders
from engine.lql.checks import PartitionRef, check_query
from engine.lql.errors import QueryError
from engine.lql.relations import make_relation, relation_expr
from engine.lql.syntax_errors import _syntax_error

__all__ = ["parse", "parse_expression", "parse_script", "parse_unchecked"]

_GRAMMAR_PATH = Path(__file__).with_name("grammar.lark")

MAX_DEPTH = 128
"""Deepest syntax tree accepted (nested patterns, operators and clauses): the transformer, the checks
and the compiler recurse over it, so a deeper one is a :class:`QueryError`, not a RecursionError."""


_LARK_OPTIONS: dict[str, Any] = {
    "parser": "lalr",
    "lexer": "contextual",
    "start": ["start", "script", "expr"],
    "propagate_positions": True,
    "maybe_placeholders": True,
}


@lru_cache(maxsize=1)
def _lark() -> Lark:
    """The LQL parser: loaded from :func:`_parser_cache` when a parser of this grammar, these options, this lark and
    this Python was saved there, else built from ``grammar.lark`` (about 0.07 CPU s, the LALR tables; a load takes
    0.007) and saved there for the next process. The cache is only a shortcut: any failure to read or write it
    builds the parser as without one."""
    grammar = _GRAMMAR_PATH.read_text(encoding="utf-8")
    path = _parser_cache(grammar)
    if path is not None:
        try:
            with open(path, "rb") as f:
                return Lark.load(f)
        except Exception:  # missing, or unreadable (another version's pickle, a truncated file): build it
            pass
    parser = Lark(grammar, **_LARK_OPTIONS)
    if path is not None:
        _save_parser(parser, path)
    return parser


def _parser_cache(grammar: str) -> Path | None:
    """Where the parser of ``grammar`` is saved: ``$LACE_CACHE_DIR`` (default ``$XDG_CACHE_HOME/lace`` or
    ``~/.cache/lace``), one file per grammar, options, lark and Python version (a SHA-256 of them in its name).
    None (no cache) when ``LACE_CACHE_DIR`` is empty, or when the directory cannot be made or is not this user's
    alone (the file is a pickle: only a directory no one else can write is trusted)."""
    import hashlib
    import os
    import stat
    import sys

    import lark

    base = os.environ.get("LACE_CACHE_DIR")
    if base is None:
        base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lace")
    if not base:
        return None
    try:
        os.makedirs(base, mode=0o700, exist_ok=True)
        st = os.stat(base)
    except OSError:
        return None
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    key = repr((grammar, sorted(_LARK_OPTIONS.items()), lark.__version__, sys.version_info[:2]))
    return Path(base) / f"lql-parser-{hashlib.sha256(key.encode()).hexdigest()[:32]}.pickle"


def _save_parser(parser: Lark, path: Path) -> None:
    """Save ``parser`` to ``path`` atomically (a temporary file in its directory, then a rename: a process reading
    it never sees half a file); nothing happens when it cannot be written."""
    import os
    import tempfile

    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            parser.save(f)
        os.replace(tmp, path)
    except Exception:
        try:
            os.unlink(tmp)
        except OSError:
            pass


@dataclass(frozen=True, slots=True)
class _Part:
    """One ``PATTERN ...`` part before it becomes a PatternQuery."""

    query: ast.PatternQuery
    partitions: tuple[PartitionRef, ...]


def _component(kind: ast.ComponentKind) -> Any:
    def build(self: Any, meta: Meta, ch: list[Any]) -> ast.Component:
        return ast.Component(kind, ch[0], str(ch[1]), _pos(meta))

    return build


@v_args(meta=True)
class _ToAst(_RuleBuilders, _ExprBuilders):
    """Builds :mod:`engine.lql.ast` nodes; raises QueryError for forms the grammar accepts loosely."""

    name_clause = join_clause = component = _first_child
    single, plus, star, neg = (_component(k) for k in ("single", "plus", "star", "neg"))

    # ---------------------------------------------------------------- queries
    def start(self, meta: Meta, ch: list[Any]) -> ast.Query:
        name, query, emit = ch
        if emit is not None:
            if isinstance(query, ast.FilterRule):
                raise QueryError.at(_pos(emit), "a FILTER rule drops events and emits none: remove EMIT INTO")
            query = replace(query, emit_into=str(emit))
        self.statements.append(self.partitions)
        self.partitions = {}
        return replace(query, name=None if name is None else str(name), pos=_pos(meta))

    def script(self, meta: Meta, ch: list[Any]) -> list[ast.Query]:
        return [q for q in ch if q is not None]

    def emit_clause(self, meta: Meta, ch: list[Any]) -> Token:
        return ch[0]

    # ---------------------------------------------------------------- pattern statements
    def single_query(self, meta: Meta, ch: list[Any]) -> ast.PatternQuery:
        part, returns = ch
        self.partitions["query"] = part.partitions
        return replace(part.query, returns=returns or ())

    def live_archived(self, meta: Meta, ch: list[Any]) -> ast.LiveArchivedQuery:
        live, archived, lookback, join, returns = ch
        self.partitions["live"] = live.partitions
        self.partitions["archived"] = archived.partitions
        return ast.LiveArchivedQuery(live.query, archived.query, lookback, join, returns or (), None, _pos(meta))

    def pattern_part(self, meta: Meta, ch: list[Any]) -> _Part:
        pattern, *clauses = ch
        seen = _clauses(clauses)
        where, partitions = seen.get("WHERE"), seen.get("PARTITION BY")
        strategy, within = seen.get("STRATEGY"), seen.get("WITHIN")
        plan = seen.get("PLAN")  # plans (issue 16): (name, position) of PLAN auto | nfa | tree
        if isinstance(pattern, ast.Component):  # `PATTERN Pass p` means SEQ(Pass p)
            pattern = ast.Seq((pattern,), pattern.pos)
        partitions = tuple(partitions or ())
        query = ast.PatternQuery(
            pattern=pattern,
            where=where,
            partition_by=tuple(p.attr for p in partitions),
            strategy=strategy or ast.DEFAULT_STRATEGY,
            within_us=within,
            pos=_pos(meta),
            **({"plan": plan[0], "plan_pos": plan[1]} if plan is not None else {}),
        )
        return _Part(query, partitions)

    def strategy_clause(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, str]:
        tok = ch[0]
        name = str(tok).lower().replace("-", "_")
        if name not in ast.STRATEGIES:
            raise QueryError.at(_pos(tok), f"unknown strategy '{tok}' (use {', '.join(ast.STRATEGIES)})")
        return ("STRATEGY", _pos(meta), name)

    # ---- plans (issue 16)
    def plan_clause(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, tuple[str, ast.Pos]]:
        tok = ch[0]
        name = str(tok).lower()
        if name not in ast.PLANS:
            raise QueryError.at(_pos(tok), f"unknown plan '{tok}' (use {', '.join(ast.PLANS)})")
        return ("PLAN", _pos(meta), (name, _pos(meta)))

    # ---- end of plans

    def within_clause(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Pos, int]:
        return ("WITHIN", _pos(meta), self._positive(ch[0], "WITHIN"))

    def lookback_clause(self, meta: Meta, ch: list[Any]) -> int:
        return self._positive(ch[0], "LOOKBACK")

    # ---------------------------------------------------------------- patterns
    def seq(self, meta: Meta, ch: list[Any]) -> ast.Seq:
        return ast.Seq(tuple(ch), _pos(meta))

    def and_pattern(self, meta: Meta, ch: list[Any]) -> ast.And:
        return ast.And(tuple(ch), _pos(meta))

    def or_pattern(self, meta: Meta, ch: list[Any]) -> ast.Or:
        return ast.Or(tuple(ch), _pos(meta))

    def type_spec(self, meta: Meta, ch: list[Any]) -> tuple[str, ...]:
        return tuple(str(t) for t in ch)

    # ---------------------------------------------------------------- Allen's relations (issue 15)
    def seq_by(self, meta: Meta, ch: list[Any]) -> ast.Seq:
        *items, rel = ch
        return ast.Seq(tuple(items), _pos(meta), by=rel)

    def relation_spec(self, meta: Meta, ch: list[Any]) -> ast.Relation:
        word, *args = ch
        durations = [d for d in args if d is not None]
        us: list[int] = []
        for d in durations:
            if d.us is None:
                raise QueryError.at(d.pos, f"{_DURATION_HINT} as a tolerance of {str(word).upper()}")
            us.append(d.us)
        return make_relation(str(word), us, _pos(word), [d.pos for d in durations])

    def rel_var(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Index | None]:
        return (str(ch[0]), None)

    def rel_indexed(self, meta: Meta, ch: list[Any]) -> tuple[str, ast.Index | None]:
        return (str(ch[0]), ch[1])

    def relation(self, meta: Meta, ch: list[Any]) -> ast.Expr:
        left, rel, right = ch
        return relation_expr(rel, left, right, _pos(meta))

    def neg_kleene(self, meta: Meta, ch: list[Any]) -> ast.Component:
        raise QueryError.at(_pos(meta), "a negation cannot be a Kleene closure: write '!Type v'")

    # ---------------------------------------------------------------- operator components (plug-ins, issue 16)
    def operator_component(self, meta: Meta, ch: list[Any]) -> ast.Component:
        """``name(Type, param, ...) v``: a component binding the composites of operator ``name``."""
        name_tok, *middle, var = ch
        name = str(name_tok).lower()
        pos = _pos(meta)
        plugin = _plugin("operator", name)
        if plugin is None:
            raise QueryError.at(pos, f"unknown operator '{name_tok}' (installed: {_installed('operator')})")
        if plugin.error is not None:
            raise QueryError.at(pos, f"operator '{name}' ({plugin.source}) is broken: {plugin.error}")
        factory = plugin.obj
        types = [str(t) for t in middle if isinstance(t, Token)]
        params = [p.value for p in middle if isinstance(p, ast.Literal)]
        if len(types) != factory.arity:
            raise QueryError.at(pos, f"operator '{name}' takes {factory.arity} event type(s): {plugin.signature}")
        declared = factory.params
        low = getattr(factory, "min_params", len(declared))
        if not low <= len(params) <= len(declared):
            want = f"{low} to {len(declared)}"
            raise QueryError.at(pos, f"operator '{name}' takes {want} parameter(s): {plugin.signature}")
        from engine.plugins.api import value_has_type

        for p, t, lit in zip(params, declared, [m for m in middle if isinstance(m, ast.Literal)], strict=False):
            if t == "duration" and not lit.is_duration:
                raise QueryError.at(lit.pos, f"operator '{name}' needs a duration here, e.g. 10 min")
            if not value_has_type(p, t):
                raise QueryError.at(lit.pos, f"operator '{name}' needs a parameter of type {t} here")
        use = ast.OperatorUse(name, tuple(types), tuple(params))
        return ast.Component("single", (use.derived_type,), str(var), pos, operator=use)


# -------------------------------------------------------------------- public entry points


def _check_depth(tree: Tree[Token], limit: int = MAX_DEPTH) -> None:
    """Raise a QueryError at the first node nested deeper than ``limit`` (iterative: no recursion)."""
    stack: list[tuple[Tree[Token], int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            meta = node.meta
            line, column = (meta.line, meta.column) if not meta.empty else (0, 0)
            reason = f"the query is nested too deeply (more than {limit} levels of patterns and operators)"
            raise QueryError(reason, line, column)
        # children pushed right to left: the leftmost node past the limit is the one reported
        stack.extend((child, depth + 1) for child in reversed(node.children) if isinstance(child, Tree))


def _run(text: str, start: str) -> tuple[Any, Any]:
    try:
        tree = _lark().parse(text, start=start)
    except UnexpectedInput as err:
        raise _syntax_error(err) from None
    _check_depth(tree)
    builder = _ToAst()
    try:
        result = builder.transform(tree)
        return result, builder.statements if start == "script" else (builder.statements or [{}])[-1]
    except VisitError as err:
        if isinstance(err.orig_exc, QueryError):
            raise err.orig_exc from None
        raise


def parse_unchecked(text: str) -> ast.Query:
    """Parse LQL text into a syntax tree without the semantic checks (for tools and tests).

    Raises
    ------
    QueryError
        On a syntax error, with the line and column of the offending token.
    """
    query, _ = _run(text, "start")
    return query


def parse(text: str, schemas: ast.Schema | None = None) -> ast.Query:
    """Parse and check an LQL query.

    Parameters
    ----------
    text : str
        The query (docs/architecture.md section 7.4; reference in docs/lql.md). Keywords are case-insensitive,
        ``--`` starts a comment that runs to the end of the line.
    schemas : dict, optional
        Event type name -> {attribute name -> type name}, type names being ``string``, ``int``,
        ``float``, ``bool`` or ``timestamp``. When given, event types, attributes and operand types
        are checked against it. ``ts`` (timestamp), ``id`` (int) and ``type`` (string) always exist.

    Returns
    -------
    PatternQuery or LiveArchivedQuery
        Durations (``within_us``, ``lookback_us``, duration literals) in int microseconds; every node
        carries the 1-based line and column of its first token.

    Raises
    ------
    QueryError
        On a syntax error or a failed semantic check: ``line``/``column`` point at the offending
        token, ``reason`` is one line.
    """
    query, partitions = _run(text, "start")
    check_query(query, schemas, partitions=partitions)
    return query


def parse_script(text: str, schemas: ast.Schema | None = None) -> list[ast.Query]:
    """Parse and check several LQL statements separated by ``;`` (a rule graph, 003).

    Each statement is checked as :func:`parse` does, against ``schemas`` extended, statement by
    statement, with the derived event types of the ``EMIT INTO`` statements before it (a statement may
    read the output of an earlier one only); positions are in the whole text.

    Raises
    ------
    QueryError
        On a syntax error or a failed check, with line and column in ``text``; also when two
        statements have the same NAME.
    """
    from engine.rules.derived import derived_schema

    queries, partitions = _run(text, "script")
    known = dict(schemas) if schemas is not None else None
    names: set[str] = set()
    for query, parts in zip(queries, partitions, strict=True):
        if query.name is not None:
            if query.name in names:
                raise QueryError.at(query.pos, f"two statements are named '{query.name}'")
            names.add(query.name)
        check_query(query, known, partitions=parts)
        if known is not None and query.emit_into is not None:
            known[query.emit_into] = derived_schema(query, known)
    return list(queries)


def parse_expression(text: str) -> ast.Expr:
    """Parse a lone LQL expression such as ``a.price * 2 > b[i-1].price`` (no checks).

    Raises
    ------
    QueryError
        On a syntax error or a malformed index/aggregate.
    """
    expr, _ = _run(text, "expr")
    return expr
