"""INTERSECT / EXCEPT [ALL]: the output count of a row value is a function of that value's count
in each branch alone (``min``, ``max(l − r, 0)``, or their 0/1 forms), so only the row values
either branch's change touches can change. With ``K`` = those values (a set, by position)::

    Δ SetOp(L, R) = −SetOp(pre L ⋉ K, pre R ⋉ K) ⊎ SetOp(post L ⋉ K, post R ⋉ K)

— the per-row counts of each side, on the touched rows only (``⋉`` null-safe on every column,
as set operations treat NULLs as equal).
"""

from __future__ import annotations

from pgtrickle.dvm import ir
from pgtrickle.dvm.rules.common import Context, col, fresh, minus, restrict, touched_rows


def delta(node: ir.SetOp, ctx: Context) -> ir.Node | None:
    changes: list[tuple[ir.Node, ir.Node]] = []
    for side in (node.left, node.right):
        change = ctx.delta(side)
        if change is not None:
            changes.append((side, change))
    if not changes:
        return None
    names = fresh("k", [*node.left.columns, *node.right.columns], len(node.output))
    touched = [
        ir.Project(touched_rows(change), tuple((n, col(c)) for n, c in zip(names, side.columns, strict=True)))
        for side, change in changes
    ]
    keys = ir.Distinct(touched[0] if len(touched) == 1 else ir.UnionAll(tuple(touched), names))

    def restricted(side: ir.Node, value: ir.Node) -> ir.Node:
        return restrict(value, keys, [col(c) for c in side.columns])

    def at(value: object) -> ir.Node:
        left = ctx.pre(node.left) if value == "pre" else ctx.post(node.left)
        right = ctx.pre(node.right) if value == "pre" else ctx.post(node.right)
        return ir.SetOp(
            node.kind, node.all, restricted(node.left, left), restricted(node.right, right), node.output
        )

    return minus(at("post"), at("pre"), node.output)
