"""Where a column's values come from: the change columns every value of a plan's column is one of.

Pure: no I/O. Key pushdown (:mod:`pgtrickle.dvm.keyed`) bounds a read by the values a change
holds; :meth:`Sources.of` says, for a column of a plan node, the change columns (``KeySource``:
a base relation's change buffer column) whose values include every value of that column — or
``None`` when some value may come from elsewhere (a computed expression, a hidden table's
change). A column of a base relation's ``post`` read gives a *derived* source: the values of
that column in the rows the read of the relation keeps — bounded only when that read is itself
bounded (:func:`pgtrickle.dvm.keyed.restrictions` checks, and breaks cycles). TPC-H Q10's
changed customers reach their orders by key, and the orders' lines by the keys of the orders
read (``l_orderkey IN (SELECT o_orderkey FROM orders WHERE o_custkey = ANY(keys))``). The
values pass unchanged through:

- ``Filter``, ``Negate``, ``Distinct``, ``TopK`` (a subset of the input's rows), ``Window`` (its
  input's columns), a ``Project`` or ``Aggregate`` column that is a plain column (a group key);
- ``UnionAll`` (by position): the union of every branch's sources — all must have some;
- ``INTERSECT`` / ``EXCEPT``: the left input's rows, by position;
- a SEMI or ANTI join: the left side's column; an INNER join: the column's own side, or, for a
  SEMI or INNER join, the other column of an equality ``a = b`` (or ``IS NOT DISTINCT FROM``)
  of the condition: every row kept matches on it (null-safely for ``IS NOT DISTINCT FROM``).

Outer joins are not followed (their padded rows hold NULLs that no change holds).

:meth:`Sources.pairs_of` says the same of several columns *together*: the change columns whose
values in one row of a change (or of a read) are, in every row of the node, the values of those
columns in that row. A composite join ``a = x AND b = y`` then bounds a read by the pairs a change
holds, not by each column's values alone (TPC-H Q9's part-suppliers of the changed lines: by
``(ps_partkey, ps_suppkey)`` about a quarter of the rows ``ps_partkey`` alone reads). The pairs
are followed only where every row of the node takes those columns from one row of its input:
through the operators above and into the one side of a join holding them all, not across an
equality (a row pairing two rows of the same change would mix their values).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sqlglot import exp

from pgtrickle.dvm import ir

__all__ = [
    "Bounds",
    "Column",
    "KeySource",
    "Sources",
    "Via",
    "columns_of",
    "equalities",
    "label",
    "plain",
    "strict_equalities",
    "window_partition",
]


Column = str | tuple[str, ...]
"""A column, or several columns taken together (a tuple of at least two): a composite key."""


def columns_of(column: Column) -> tuple[str, ...]:
    """The columns ``column`` names (one, or the parts of a composite key)."""
    return (column,) if isinstance(column, str) else column


def label(column: Column) -> str:
    """``column`` as one sortable text (a composite key's parts joined by commas)."""
    return column if isinstance(column, str) else ",".join(column)


Via = tuple[tuple[str, tuple["KeySource", ...]], ...]
"""Bounds a relation's rows are known to meet: ``(column, keys)`` pairs, each saying the row's
``column`` holds a value of one of ``keys`` (change keys only), all of them at once."""


@dataclass(frozen=True, order=True)
class KeySource:
    """The values of ``column`` (a source column of ``relation``) in the window's changes; or,
    ``derived``, in the rows the refresh reads of ``relation``'s contents (its ``post`` read,
    bounded as :func:`pgtrickle.dvm.keyed.restrictions` bounds it) — or, with ``via``, in the
    rows of ``relation`` that meet every bound of ``via`` (whatever the relation's own read is).
    A composite ``column`` (a tuple): the tuples of values those columns hold in one such row."""

    relation: str
    column: Column
    derived: bool = False
    via: Via = ()

    @property
    def waits(self) -> bool:
        """Whether the values wait for the bound of ``relation``'s own read (a derived source
        without ``via``)."""
        return self.derived and not self.via


def _conjuncts(condition: exp.Expr | None) -> Iterator[exp.Expr]:
    if condition is None:
        return
    node = condition.unnest() if isinstance(condition, exp.Paren) else condition
    if isinstance(node, exp.And):
        yield from _conjuncts(node.this)
        yield from _conjuncts(node.expression)
    else:
        yield node


def plain(expression: exp.Expr) -> str | None:
    """The column ``expression`` is, when it is a plain (unqualified) column."""
    node = expression.unnest() if isinstance(expression, exp.Paren) else expression
    return node.name if isinstance(node, exp.Column) and not node.table else None


def equalities(condition: exp.Expr | None) -> list[tuple[str, str]]:
    """The ``a = b`` / ``a IS NOT DISTINCT FROM b`` conjuncts of ``condition`` between plain columns."""
    return _equalities(condition, (exp.EQ, exp.NullSafeEQ))


def strict_equalities(condition: exp.Expr | None) -> list[tuple[str, str]]:
    """The ``a = b`` conjuncts of ``condition`` between plain columns: those no row with a NULL on
    either side meets (``IS NOT DISTINCT FROM`` is left out)."""
    return _equalities(condition, (exp.EQ,))


def _equalities(condition: exp.Expr | None, kinds: tuple[type[exp.Expr], ...]) -> list[tuple[str, str]]:
    out = []
    for term in _conjuncts(condition):
        if isinstance(term, kinds):
            left, right = plain(term.this), plain(term.expression)
            if left is not None and right is not None:
                out.append((left, right))
    return out


def window_partition(node: ir.Window) -> set[str]:
    """The input columns every window function of ``node`` partitions by (plain columns)."""
    common: set[str] | None = None
    for _, call in node.functions:
        window = call if isinstance(call, exp.Window) else call.find(exp.Window)
        parts = (
            {name for e in (window.args.get("partition_by") or []) if (name := plain(e))} if window else set()
        )
        common = parts if common is None else common & parts
    return (common or set()) & set(node.input.columns)


Found = frozenset[KeySource] | None
Bounds = frozenset[tuple[str, frozenset[KeySource]]]
"""Bounds every row of a node that matters meets: ``(column, change keys)`` pairs (see :data:`Via`)."""

_NO_BOUNDS: Bounds = frozenset()


def _renamed(bounds: Bounds, mapping: dict[str, str]) -> Bounds:
    """``bounds`` on the columns ``mapping`` renames (the others dropped: fewer bounds, still true)."""
    return frozenset((mapping[c], k) for c, k in bounds if c in mapping)


def _via(bounds: Bounds, to_source: dict[str, str]) -> Via:
    """``bounds`` on a scan's columns as the bounds of its relation's rows (``KeySource.via``)."""
    renamed = _renamed(bounds, to_source)
    # A bound implied by a narrower one on the same column (fewer sources) says nothing more.
    kept = {(c, k) for c, k in renamed if not any(c2 == c and k2 < k for c2, k2 in renamed)}
    return tuple(sorted((c, tuple(sorted(k))) for c, k in kept))


class Sources:
    """:meth:`of`, memoized per ``(node, column, bounds)`` over one analysis.

    ``bounds`` carry what the rows of ``node`` that reach the result are known to meet: an INNER
    or SEMI join keeps only the rows of a side whose column equals a value of the other side's
    column, so where the other side's column comes from change keys alone, the side's rows hold
    one of those keys there. A base relation's read under such bounds gives a derived source
    *with* them (``KeySource.via``): the values of its column in the rows of the relation meeting
    the bounds — TPC-H Q2's part-suppliers of the changed suppliers give their parts
    (``SELECT ps_partkey FROM partsupp WHERE ps_suppkey = ANY(keys)``), which bound the other
    reads of part-suppliers without waiting for their own bound (that would be a cycle)."""

    def __init__(self) -> None:
        self._memo: dict[tuple[int, str, Bounds], Found] = {}
        self._pairs: dict[tuple[int, tuple[str, ...], Bounds], Found] = {}
        self._nodes: list[ir.Node] = []  # keeps every memoized node alive, so ids stay unique

    def of(self, node: ir.Node, column: str, bounds: Bounds = _NO_BOUNDS) -> Found:
        """The change columns every value of ``column`` in ``node`` comes from, if there are;
        ``bounds``: what the rows of ``node`` that matter are known to meet."""
        key = (id(node), column, bounds)
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = None  # a cycle through shared subtrees finds nothing
        self._nodes.append(node)
        found = self._compute(node, column, bounds)
        self._memo[key] = found
        return found

    def _compute(self, node: ir.Node, column: str, bounds: Bounds) -> Found:
        if isinstance(node, ir.Scan):
            own = [k for c, k in bounds if c == column]
            if own:  # the column itself holds one of those keys: they are its values' sources
                return min(own, key=lambda k: (len(k), sorted(k)))
            to_source = dict(zip(node.output, node.source_columns, strict=True))
            via = _via(bounds, to_source)
            return frozenset({KeySource(node.relation, to_source[column], derived=True, via=via)})
        if isinstance(node, ir.Delta):
            scan = node.scan
            if column in scan.output:
                return frozenset({KeySource(scan.relation, scan.source_columns[scan.output.index(column)])})
            return None
        if isinstance(node, (ir.Filter, ir.Negate, ir.Distinct, ir.TopK, ir.Window)):
            if column not in node.input.columns:
                return None
            passed = frozenset((c, k) for c, k in bounds if c in node.input.columns)
            return self.of(node.input, column, passed)
        if isinstance(node, (ir.Project, ir.Aggregate)):
            named = dict(node.outputs if isinstance(node, ir.Project) else node.keys)
            inner = plain(named[column]) if column in named else None
            if inner is None:
                return None
            renames = {c: p for c, e in named.items() if (p := plain(e)) is not None}
            return self.of(node.input, inner, _renamed(bounds, renames))
        if isinstance(node, ir.UnionAll):
            position = node.output.index(column)
            union: frozenset[KeySource] = frozenset()
            for branch in node.branches:
                mapping = dict(zip(node.columns, branch.columns, strict=True))
                found = self.of(branch, branch.columns[position], _renamed(bounds, mapping))
                if found is None:
                    return None
                union |= found
            return union
        if isinstance(node, ir.SetOp):
            mapping = dict(zip(node.columns, node.left.columns, strict=True))
            return self.of(node.left, mapping[column], _renamed(bounds, mapping))
        if isinstance(node, ir.Join) and node.kind in (ir.JoinKind.INNER, ir.JoinKind.SEMI, ir.JoinKind.ANTI):
            return self._join(node, column, bounds)
        return None

    def _join(self, node: ir.Join, column: str, bounds: Bounds) -> Found:
        """The column's own side's sources (under the bounds its rows meet) or, for a SEMI or
        INNER join, those of the other column of an equality: the ones with the fewest sources
        waiting for a read's bound, then the fewest."""
        side = node.left if column in node.left.columns else node.right
        options = [self.of(side, column, self._side_bounds(node, side, bounds))]
        if node.kind is not ir.JoinKind.ANTI:
            for a, b in equalities(node.condition):
                other = b if a == column else a if b == column else None
                if other is None:
                    continue
                other_side = node.left if other in node.left.columns else node.right
                if other in other_side.columns:
                    options.append(self.of(other_side, other))
        found = [f for f in options if f is not None]
        if not found:
            return None
        return min(
            found, key=lambda f: (sum(k.waits for k in f), sum(k.derived for k in f), len(f), sorted(f))
        )

    def _side_bounds(self, node: ir.Join, side: ir.Node, bounds: Bounds) -> Bounds:
        """The bounds the rows of ``side`` that reach ``node``'s result meet: those on its columns
        from above, and, for the matched sides of an INNER or SEMI join (a SEMI join's left),
        each equality whose other column's values are change keys only."""
        out = {(c, k) for c, k in bounds if c in side.columns}
        matched = node.kind is ir.JoinKind.INNER or (node.kind is ir.JoinKind.SEMI and side is node.left)
        if matched:
            other_side = node.right if side is node.left else node.left
            for a, b in equalities(node.condition):
                for mine, other in ((a, b), (b, a)):
                    if mine in side.columns and other in other_side.columns:
                        out |= {(mine, k) for c, k in bounds if c == other}  # across the equality
                        keys = self.of(other_side, other)
                        if keys is not None and not any(k.derived for k in keys):
                            out.add((mine, keys))
        return frozenset(out)

    def pairs_of(self, node: ir.Node, columns: tuple[str, ...], bounds: Bounds = _NO_BOUNDS) -> Found:
        """The composite change columns (``KeySource`` with a tuple ``column``) whose values, taken
        from one row of a change — or, derived, of a base relation's read (``via`` ``bounds``, what
        the rows of ``node`` that matter meet, as :meth:`of`) — are the values of ``columns`` (two
        or more) in every row of ``node``; ``None`` when no such columns are known (module
        docstring)."""
        key = (id(node), columns, bounds)
        if key not in self._pairs:
            self._pairs[key] = None  # a cycle through shared subtrees finds nothing
            self._nodes.append(node)
            self._pairs[key] = self._pairs_of(node, columns, bounds)
        return self._pairs[key]

    def _pairs_of(self, node: ir.Node, columns: tuple[str, ...], bounds: Bounds) -> Found:
        if isinstance(node, (ir.Scan, ir.Delta)):
            scan = node.scan if isinstance(node, ir.Delta) else node
            to_source = dict(zip(scan.output, scan.source_columns, strict=True))
            if not all(c in to_source for c in columns):
                return None
            source = tuple(to_source[c] for c in columns)
            if isinstance(node, ir.Delta):
                return frozenset({KeySource(scan.relation, source)})
            return frozenset({KeySource(scan.relation, source, derived=True, via=_via(bounds, to_source))})
        if isinstance(node, (ir.Filter, ir.Negate, ir.Distinct, ir.TopK, ir.Window)):
            if not set(columns) <= set(node.input.columns):
                return None
            passed = frozenset((c, k) for c, k in bounds if c in node.input.columns)
            return self.pairs_of(node.input, columns, passed)
        if isinstance(node, (ir.Project, ir.Aggregate)):
            named = dict(node.outputs if isinstance(node, ir.Project) else node.keys)
            inner = tuple(plain(named[c]) if c in named else None for c in columns)
            if any(c is None for c in inner):
                return None
            renames = {c: p for c, e in named.items() if (p := plain(e)) is not None}
            return self.pairs_of(
                node.input, tuple(c for c in inner if c is not None), _renamed(bounds, renames)
            )
        if isinstance(node, (ir.UnionAll, ir.SetOp)):
            branches = node.inputs if isinstance(node, ir.UnionAll) else (node.left,)
            union: frozenset[KeySource] = frozenset()
            for branch in branches:
                mapping = dict(zip(node.columns, branch.columns, strict=True))
                found = self.pairs_of(branch, tuple(mapping[c] for c in columns), _renamed(bounds, mapping))
                if found is None:
                    return None
                union |= found
            return union
        if isinstance(node, ir.Join) and node.kind in (ir.JoinKind.INNER, ir.JoinKind.SEMI, ir.JoinKind.ANTI):
            sides = (node.left,) if node.kind is not ir.JoinKind.INNER else (node.left, node.right)
            for side in sides:
                if set(columns) <= set(side.columns):
                    return self.pairs_of(side, columns, self._side_bounds(node, side, bounds))
        return None
