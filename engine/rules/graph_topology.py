"""The statements of the rule graph and their order (:mod:`engine.rules.graph`; 003 section 4: rules inserted,
updated and deleted while the stream runs; docs/architecture.md section 7.9).

:class:`_Topology` is the part of :class:`~engine.rules.graph.RuleGraph` that adds and removes statements:
FILTER rules by event type, the other statements as :class:`~engine.rules.graph_nodes.Node` objects linked by
the derived types they read and emit (``EMIT INTO``), kept in topological order (emitters before readers) so
that one pass propagates a watermark through every layer. A statement whose EMIT INTO would close a cycle is
refused with a :class:`~engine.lql.errors.QueryError` (``EMIT INTO a would create a cycle a → b → a``).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine.lql import ast
from engine.lql.checks import read_types
from engine.lql.errors import QueryError
from engine.match import Match
from engine.rules.filters import CompiledFilter
from engine.rules.graph_nodes import Factory, Node, _negation_slack, _timed, statement_ast


class _Topology:
    """Statements in, statements out, cycles refused, topological order (module docstring). The state is set up
    by :meth:`engine.rules.graph.RuleGraph.__init__`."""

    factory: Factory
    router: Any
    filters: dict[str, list[CompiledFilter]]
    filter_names: dict[str, CompiledFilter]
    nodes: dict[str, Node]
    _readers: dict[str, list[Node]]
    _emitters: dict[str, list[Node]]
    _order: list[Node]
    _timed: list[Node]

    @property
    def derived_types(self) -> frozenset[str]:
        """The event types some node emits into."""
        return frozenset(self._emitters)

    def names(self) -> list[str]:
        """Every statement's name: filters, then nodes in topological order."""
        return [*self.filter_names, *(n.name for n in self._order)]

    def add(
        self, name: str, statement: Any, detector: Any = None, *, version: int = 1, identity: str | None = None
    ) -> None:
        """Add a compiled statement (from :func:`engine.detector.compile_statement`) under ``name``.

        ``identity`` (default ``name``) and ``version`` name the statement in the ids of its derived events
        (:func:`engine.rules.derived.derived_event_id`): give the same ones when the same statement is added again
        (after a restart) and other ones for a changed statement.

        Raises
        ------
        QueryError
            When ``name`` is taken or the statement's EMIT INTO would create a cycle
            (``EMIT INTO a would create a cycle a → b → a``).
        """
        if name in self.nodes or name in self.filter_names:
            raise QueryError(f"a statement named '{name}' already exists", 0, 0)
        if isinstance(statement, CompiledFilter):
            self.filter_names[name] = statement
            self.filters.setdefault(statement.type, []).append(statement)
            return
        tree = statement_ast(statement)
        reads = read_types(tree)
        emit = getattr(tree, "emit_into", None)
        if emit is not None:
            path = self._path(reads, emit)
            if path is not None:
                chain = " \u2192 ".join([*path, emit])
                raise QueryError.at(getattr(tree, "pos", ast.NOPOS), f"EMIT INTO {emit} would create a cycle {chain}")
        node = Node(
            name,
            statement,
            detector if detector is not None else self.factory(statement),
            reads,
            emit,
            identity=name if identity is None else identity,
            version=version,
            negation_slack_us=_negation_slack(statement),
        )
        self.nodes[name] = node
        for t in reads:
            self._readers.setdefault(t, []).append(node)
        if emit is not None:
            self._emitters.setdefault(emit, []).append(node)
        if self.router is not None:
            self.router.add(name, tree)
        if emit is None:  # nothing reads it: last in the topological order (O(1), not a full re-sort)
            node.buffered = bool(reads.intersection(self._emitters))
            self._order.append(node)
            if node.buffered or _timed(node):
                self._timed.append(node)
        else:
            self._reorder()

    def remove(self, name: str) -> list[Match]:
        """Remove a statement; returns nothing of it (its partial matches and open windows are dropped).

        Raises
        ------
        KeyError
            For an unknown name.
        """
        if name in self.filter_names:
            f = self.filter_names.pop(name)
            self.filters[f.type].remove(f)
            return []
        node = self.nodes.pop(name)
        for t in node.reads:
            self._readers[t].remove(node)
        if self.router is not None:
            self.router.remove(name)
        if node.emit_into is not None:
            self._emitters[node.emit_into].remove(node)
            if not self._emitters[node.emit_into]:
                del self._emitters[node.emit_into]
            self._reorder()
        else:  # nothing read it: the others keep their order
            self._order = [n for n in self._order if n is not node]
            self._timed = [n for n in self._timed if n is not node]
        return []

    def cycle(self, statement: Any, exclude: str | None = None) -> str | None:
        """Why adding ``statement`` (replacing the node ``exclude``, if given) would close a cycle, or None."""
        tree = statement_ast(statement)
        emit = getattr(tree, "emit_into", None)
        if emit is None:
            return None
        path = self._path(read_types(tree), emit, exclude)
        if path is None:
            return None
        chain = " \u2192 ".join([*path, emit])
        return f"EMIT INTO {emit} would create a cycle {chain}"

    def _path(self, reads: Iterable[str], target: str, exclude: str | None = None) -> list[str] | None:
        """The derived types from ``target`` to one of ``reads`` through existing nodes (``[target, ..., r]``:
        with the new statement, a cycle), or None."""
        goal = set(reads)
        stack: list[list[str]] = [[target]]
        seen: set[str] = set()
        while stack:
            path = stack.pop()
            t = path[-1]
            if t in goal:
                return path
            if t in seen:
                continue
            seen.add(t)
            for node in self._readers.get(t, ()):
                if node.emit_into is not None and node.name != exclude:
                    stack.append([*path, node.emit_into])
        return None

    def _reorder(self) -> None:
        """Topological order of the nodes (emitters before readers) and the buffered/timed sets."""
        derived = set(self._emitters)
        indegree: dict[str, int] = {}
        for node in self.nodes.values():
            node.buffered = bool(node.reads & derived)
            indegree[node.name] = sum(len(self._emitters.get(t, ())) for t in node.reads)
        ready = [n for n in self.nodes.values() if indegree[n.name] == 0]
        order: list[Node] = []
        while ready:
            node = ready.pop(0)
            order.append(node)
            if node.emit_into is not None:
                for reader in self._readers.get(node.emit_into, ()):
                    indegree[reader.name] -= 1
                    if indegree[reader.name] == 0:
                        ready.append(reader)
        self._order = order
        self._timed = [n for n in order if n.buffered or n.emit_into is not None or _timed(n)]
