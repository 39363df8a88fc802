"""Key pushdown: which reads of a delta plan only matter for the keys a change touches.

Pure: no I/O. A rule that recomputes "only what changed" restricts ``post``/``pre`` of its input
to the touched keys with a SEMI join on keys taken from a change (``restrict(post, K, exprs)``),
and the telescoping join rule joins a change with ``post`` of the other side on the join keys.
In both cases only the rows of the read whose key column holds a value of the change can reach
the result. :func:`restrictions` finds, for every relation the plan reads (a base relation's
``post``, or a hidden table), one such column and the change column whose values bound it — when
**every** place the plan reads it from is bound that way — so the refresh reads only those rows
in PostgreSQL (``col = ANY(keys)``), not the whole table.

The analysis walks the plan top down carrying *demands*: ``(column, source)`` pairs meaning "only
the rows of this node whose ``column`` holds a value of ``source`` matter". A demand passes
through ``Filter``, ``Negate``, ``Distinct``, ``UnionAll`` (by position), a ``Project`` column
that is a plain column, an ``Aggregate`` group key that is a plain column, and to the side of a
join holding the column. A SEMI or INNER join adds a demand on one side for each equality
(``=`` or ``IS NOT DISTINCT FROM``) whose other side's column *comes from a change*
(:func:`_source_of`: through the same operators, down to a ``Delta``'s column). Everything else
(outer joins, windows, TopK, set operations) drops the demands: its input is read whole.

A restriction is a superset filter: the caller may also keep rows whose column is NULL (a NULL
key is a group, and ``IS NOT DISTINCT FROM`` matches it).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sqlglot import exp

from pgtrickle.dvm import ir

__all__ = ["KeySource", "Restriction", "restrictions"]


@dataclass(frozen=True, order=True)
class KeySource:
    """The values of ``column`` (a source column of ``relation``) in the window's changes."""

    relation: str
    column: str


@dataclass(frozen=True, order=True)
class Restriction:
    """Read only the rows whose ``column`` holds a value of ``keys``. ``column`` is a source
    column for a base relation's read, a column of the node for a hidden table's read."""

    column: str
    keys: KeySource


Demand = frozenset[tuple[str, KeySource]]
ReadKey = tuple[str, object]
"""``("post", relation)`` or ``("materialized", node)``."""


def _conjuncts(condition: exp.Expr | None) -> Iterator[exp.Expr]:
    if condition is None:
        return
    node = condition.unnest() if isinstance(condition, exp.Paren) else condition
    if isinstance(node, exp.And):
        yield from _conjuncts(node.this)
        yield from _conjuncts(node.expression)
    else:
        yield node


def _plain(expression: exp.Expr) -> str | None:
    node = expression.unnest() if isinstance(expression, exp.Paren) else expression
    return node.name if isinstance(node, exp.Column) and not node.table else None


def _equalities(condition: exp.Expr | None) -> list[tuple[str, str]]:
    out = []
    for term in _conjuncts(condition):
        if isinstance(term, (exp.EQ, exp.NullSafeEQ)):
            left, right = _plain(term.this), _plain(term.expression)
            if left is not None and right is not None:
                out.append((left, right))
    return out


def _source_of(node: ir.Node, column: str, memo: dict[tuple[int, str], KeySource | None]) -> KeySource | None:
    """The change column every value of ``column`` in ``node`` comes from, if there is one."""
    key = (id(node), column)
    if key in memo:
        return memo[key]
    memo[key] = None
    found: KeySource | None = None
    if isinstance(node, ir.Delta):
        scan = node.scan
        if column in scan.output:
            found = KeySource(scan.relation, scan.source_columns[scan.output.index(column)])
    elif isinstance(node, (ir.Filter, ir.Negate, ir.Distinct)):
        found = _source_of(node.input, column, memo)
    elif isinstance(node, (ir.Project, ir.Aggregate)):
        named = node.outputs if isinstance(node, ir.Project) else node.keys
        inner = _plain(dict(named)[column]) if column in dict(named) else None
        found = _source_of(node.input, inner, memo) if inner is not None else None
    elif isinstance(node, ir.UnionAll):
        position = node.output.index(column)
        sources = {_source_of(b, b.columns[position], memo) for b in node.branches}
        found = sources.pop() if len(sources) == 1 else None
    elif isinstance(node, ir.Join) and node.kind in (ir.JoinKind.INNER, ir.JoinKind.SEMI, ir.JoinKind.ANTI):
        side = node.left if column in node.left.columns else node.right
        found = _source_of(side, column, memo)
        if found is None and node.kind is ir.JoinKind.INNER:
            for a, b in _equalities(node.condition):
                other = b if a == column else a if b == column else None
                if other is not None and (found := _source_of_either(node, other, memo)) is not None:
                    break
    memo[key] = found
    return found


def _source_of_either(
    node: ir.Join, column: str, memo: dict[tuple[int, str], KeySource | None]
) -> KeySource | None:
    side = node.left if column in node.left.columns else node.right
    return _source_of(side, column, memo) if column in side.columns else None


class _Walk:
    def __init__(self) -> None:
        self.uses: dict[ReadKey, list[Demand]] = {}
        self._seen: set[tuple[int, Demand]] = set()
        self._sources: dict[tuple[int, str], KeySource | None] = {}

    def visit(self, node: ir.Node, demand: Demand) -> None:
        if (id(node), demand) in self._seen:
            return
        self._seen.add((id(node), demand))
        if isinstance(node, ir.Scan):
            to_source = dict(zip(node.output, node.source_columns, strict=True))
            self._use(("post", node.relation), frozenset((to_source[c], k) for c, k in demand))
        elif isinstance(node, ir.Materialized):
            if not node.change:  # a change buffer is read whole (it is the change)
                self._use(("materialized", node.node), demand)
        elif isinstance(node, (ir.Filter, ir.Negate, ir.Distinct)):
            self.visit(node.input, demand)
        elif isinstance(node, (ir.Project, ir.Aggregate)):
            named = dict(node.outputs if isinstance(node, ir.Project) else node.keys)
            passed = frozenset((inner, k) for c, k in demand if c in named and (inner := _plain(named[c])))
            self.visit(node.input, passed)
        elif isinstance(node, ir.UnionAll):
            for branch in node.branches:
                mapping = dict(zip(node.output, branch.columns, strict=True))
                self.visit(branch, frozenset((mapping[c], k) for c, k in demand))
        elif isinstance(node, ir.Join):
            self._join(node, demand)
        else:
            for child in node.inputs:
                self.visit(child, frozenset())

    def _join(self, node: ir.Join, demand: Demand) -> None:
        if node.kind not in (ir.JoinKind.INNER, ir.JoinKind.SEMI, ir.JoinKind.ANTI):
            for child in node.inputs:
                self.visit(child, frozenset())
            return
        left = {(c, k) for c, k in demand if c in node.left.columns}
        right = {(c, k) for c, k in demand if c in node.right.columns and node.kind is ir.JoinKind.INNER}
        if node.kind is not ir.JoinKind.ANTI:
            for a, b in _equalities(node.condition):
                for mine, other in ((a, b), (b, a)):
                    if mine in node.left.columns and other in node.right.columns:
                        source = _source_of(node.right, other, self._sources)
                        if source is not None:
                            left.add((mine, source))
                    if (
                        node.kind is ir.JoinKind.INNER
                        and mine in node.right.columns
                        and other in node.left.columns
                    ):
                        source = _source_of(node.left, other, self._sources)
                        if source is not None:
                            right.add((mine, source))
        self.visit(node.left, frozenset(left))
        self.visit(node.right, frozenset(right))

    def _use(self, key: ReadKey, demand: Demand) -> None:
        self.uses.setdefault(key, []).append(demand)


def restrictions(plan: ir.Node) -> dict[ReadKey, Restriction]:
    """For each read of ``plan`` that every use bounds by a change's keys, one such bound
    (reads read whole are absent). Keys: ``("post", relation)``, ``("materialized", node)``."""
    walk = _Walk()
    walk.visit(plan, frozenset())
    out: dict[ReadKey, Restriction] = {}
    for key, demands in walk.uses.items():
        common = frozenset.intersection(*demands) if demands else frozenset()
        if common:
            column, source = min(common)
            out[key] = Restriction(column, source)
    return out
