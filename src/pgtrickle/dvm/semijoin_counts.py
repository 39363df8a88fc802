"""A semi/anti join's right side kept as its rows' count per join key.

Pure: no I/O. The semi/anti join rule (:mod:`pgtrickle.dvm.rules.semijoin`) finds the left rows
whose match may have flipped by reading the right side before and after the change, restricted
to the touched join keys: every right row of every touched key. When the right side is itself a
join of large tables (TPC-H Q20: the parts' suppliers with enough stock for a year's shipments,
keyed by supplier), the touched keys are most of them, and so is the read.

A semi join only asks whether a key has a matching row, so the right side can be replaced by
its rows' count per join key — ``Aggregate(R, keys, COUNT(*) AS __pgt_rows)``: a left row
matches a group exactly when it matches one of the group's rows (a NULL key matches neither,
by ``=``). That aggregate is kept in a hidden table (:data:`pgtrickle.dvm.materialize.
SEMI_JOIN_COUNTS`) whose state is maintained algebraically (:mod:`pgtrickle.dvm.kept_state`):
its change reads only the change of ``R``, and the existence flips read the table by key.

:func:`rewrite` does this for every SEMI/ANTI join whose condition is only equalities between a
left and a right column and whose right side holds a join; a right side that is one relation
(filtered) is read by key cheaply and stays as it is — unless the left side's change cannot
bound its keys: when the left side holds a join with no equality between its two sides (a cross
or theta join: TPC-H Q22's customers whose balance is above an average), one changed row on one
side of it reaches every row of the other, so the left change's keys are not those of any change
and the right side would be read whole for them (Q22: all 1.5M orders, twice, for a handful of
customers whose existence test matters). Counted, that read is the hidden table of one row per
key (Q22: ~100,000 customers with orders).
"""

from __future__ import annotations

import dataclasses

from sqlglot import exp

from pgtrickle.dvm import ir, ir_rewrite
from pgtrickle.dvm.keyed_sources import equalities

__all__ = ["SEMI_COUNT", "counted_keys", "is_count", "rewrite"]

SEMI_COUNT = "__pgt_rows"
"""The count column of a semi/anti join's right side kept as counts."""


def _conjuncts(condition: exp.Expr) -> list[exp.Expr]:
    if isinstance(condition, exp.And):
        return [*_conjuncts(condition.this), *_conjuncts(condition.expression)]
    if isinstance(condition, exp.Paren):
        return _conjuncts(condition.this)
    return [condition]


def counted_keys(node: ir.Join) -> tuple[str, ...] | None:
    """The right side's columns of ``node``'s condition when it is only ``left = right``
    equalities between plain columns (``None`` otherwise)."""
    if node.condition is None:
        return None
    left, right = set(node.left.columns), set(node.right.columns)
    keys: list[str] = []
    for term in _conjuncts(node.condition):
        if not isinstance(term, exp.EQ):
            return None
        a, b = term.this, term.expression
        if not (isinstance(a, exp.Column) and isinstance(b, exp.Column)) or a.table or b.table:
            return None
        if a.name in left and b.name in right:
            keys.append(b.name)
        elif b.name in left and a.name in right:
            keys.append(a.name)
        else:
            return None
    return tuple(dict.fromkeys(keys)) or None


def is_count(node: ir.Node) -> bool:
    """Whether ``node`` is a right side this module made (or its state)."""
    return isinstance(node, ir.Aggregate) and bool(node.aggregates) and node.aggregates[0][0] == SEMI_COUNT


def _holds_join(node: ir.Node) -> bool:
    return any(isinstance(n, ir.Join) for n in ir.walk(node))


def _unkeyed(join: ir.Join) -> bool:
    """Whether ``join`` matches rows with no equality between a column of each side (a cross or
    theta join): a change of one side meets every row of the other, whatever its keys."""
    left, right = set(join.left.columns), set(join.right.columns)
    return not any(
        (a in left and b in right) or (a in right and b in left) for a, b in equalities(join.condition)
    )


def _fans_out(node: ir.Node) -> bool:
    """Whether a change under ``node`` can reach rows no change's keys bound: ``node`` holds a
    join (not a semi/anti join, whose rows are its left side's) matching without a key."""
    return any(
        isinstance(n, ir.Join) and n.kind not in (ir.JoinKind.SEMI, ir.JoinKind.ANTI) and _unkeyed(n)
        for n in ir.walk(node)
    )


def _counted(node: ir.Node) -> ir.Node:
    if not (isinstance(node, ir.Join) and node.kind in (ir.JoinKind.SEMI, ir.JoinKind.ANTI)):
        return node
    keys = counted_keys(node)
    if keys is None or is_count(node.right) or not (_holds_join(node.right) or _fans_out(node.left)):
        return node
    counts = ir.Aggregate(
        node.right,
        tuple((k, exp.column(k)) for k in keys),
        ((SEMI_COUNT, exp.Count(this=exp.Star())),),
    )
    return dataclasses.replace(node, right=counts)


def rewrite(tree: ir.Node) -> ir.Node:
    """``tree`` with the right side of every eligible SEMI/ANTI join counted (see the module
    docstring); ``tree`` itself when there is none."""
    return ir_rewrite.transform(tree, _counted)
