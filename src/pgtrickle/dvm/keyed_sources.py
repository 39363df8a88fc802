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
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sqlglot import exp

from pgtrickle.dvm import ir

__all__ = ["KeySource", "Sources", "equalities", "plain", "window_partition"]


@dataclass(frozen=True, order=True)
class KeySource:
    """The values of ``column`` (a source column of ``relation``) in the window's changes; or,
    ``derived``, in the rows the refresh reads of ``relation``'s contents (its ``post`` read,
    bounded as :func:`pgtrickle.dvm.keyed.restrictions` bounds it)."""

    relation: str
    column: str
    derived: bool = False


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
    out = []
    for term in _conjuncts(condition):
        if isinstance(term, (exp.EQ, exp.NullSafeEQ)):
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


class Sources:
    """:meth:`of`, memoized per ``(node, column)`` over one analysis."""

    def __init__(self) -> None:
        self._memo: dict[tuple[int, str], Found] = {}
        self._nodes: list[ir.Node] = []  # keeps every memoized node alive, so ids stay unique

    def of(self, node: ir.Node, column: str) -> Found:
        """The change columns every value of ``column`` in ``node`` comes from, if there are."""
        key = (id(node), column)
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = None  # a cycle through shared subtrees finds nothing
        self._nodes.append(node)
        found = self._compute(node, column)
        self._memo[key] = found
        return found

    def _compute(self, node: ir.Node, column: str) -> Found:
        if isinstance(node, ir.Scan):
            source = node.source_columns[node.output.index(column)]
            return frozenset({KeySource(node.relation, source, derived=True)})
        if isinstance(node, ir.Delta):
            scan = node.scan
            if column in scan.output:
                return frozenset({KeySource(scan.relation, scan.source_columns[scan.output.index(column)])})
            return None
        if isinstance(node, (ir.Filter, ir.Negate, ir.Distinct, ir.TopK, ir.Window)):
            return self.of(node.input, column) if column in node.input.columns else None
        if isinstance(node, (ir.Project, ir.Aggregate)):
            named = dict(node.outputs if isinstance(node, ir.Project) else node.keys)
            inner = plain(named[column]) if column in named else None
            return self.of(node.input, inner) if inner is not None else None
        if isinstance(node, ir.UnionAll):
            position = node.output.index(column)
            union: frozenset[KeySource] = frozenset()
            for branch in node.branches:
                found = self.of(branch, branch.columns[position])
                if found is None:
                    return None
                union |= found
            return union
        if isinstance(node, ir.SetOp):
            return self.of(node.left, node.left.columns[node.output.index(column)])
        if isinstance(node, ir.Join) and node.kind in (ir.JoinKind.INNER, ir.JoinKind.SEMI, ir.JoinKind.ANTI):
            return self._join(node, column)
        return None

    def _join(self, node: ir.Join, column: str) -> Found:
        """The column's own side's sources or, for a SEMI or INNER join, those of the other
        column of an equality: the ones with the fewest derived sources, then the fewest."""
        side = node.left if column in node.left.columns else node.right
        options = [self.of(side, column)]
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
        return min(found, key=lambda f: (sum(k.derived for k in f), len(f), sorted(f)))
