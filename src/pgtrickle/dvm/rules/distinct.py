"""Distinct (SELECT DISTINCT; UNION is ``Distinct(UnionAll)``): a COUNT(*) aggregate grouped by
every column, whose row exists while its count is > 0 — so its change is the aggregate rule's,
over the rows the input's change touches, projected back to the columns."""

from __future__ import annotations

from sqlglot import exp

from pgtrickle.dvm import ir
from pgtrickle.dvm.rules.common import Context, col, fresh


def expand(node: ir.Distinct) -> ir.Node:
    """``node`` as ``π cols (GROUP BY cols, COUNT(*))`` (same columns)."""
    columns = node.input.columns
    (count,) = fresh("count", columns, 1)
    grouped = ir.Aggregate(
        node.input, tuple((c, col(c)) for c in columns), ((count, exp.Count(this=exp.Star())),)
    )
    return ir.Project(grouped, tuple((c, col(c)) for c in columns))


def delta(node: ir.Distinct, ctx: Context) -> ir.Node | None:
    return ctx.delta(expand(node))
