"""LEFT, RIGHT and FULL joins: the inner part by the join rule, the padded part by the anti-join
rule — any predicate, any nesting::

    L ⟕ R = (L ⋈ R) ⊎ pad(L ▷ R)        L ⟖ R = (L ⋈ R) ⊎ pad(R ▷ L)
    L ⟗ R = (L ⋈ R) ⊎ pad(L ▷ R) ⊎ pad(R ▷ L)

where ``pad`` is a ``Project`` putting NULL in the other side's columns. :func:`expand` is the
rewrite; the change is the change of the rewritten (linear ⊎ anti-join) tree.
"""

from __future__ import annotations

from sqlglot import exp

from pgtrickle.dvm import ir
from pgtrickle.dvm.rules.common import Context, col


def _pad(unmatched: ir.Node, left: tuple[str, ...], right: tuple[str, ...], keep_left: bool) -> ir.Node:
    outputs = tuple((c, col(c) if keep_left else exp.Null()) for c in left) + tuple(
        (c, exp.Null() if keep_left else col(c)) for c in right
    )
    return ir.Project(unmatched, outputs)


def expand(node: ir.Join) -> ir.Node:
    """The outer join ``node`` as ``inner ⊎ padded anti-join part(s)`` (same columns)."""
    left, right, condition = node.left, node.right, node.condition
    parts: list[ir.Node] = [ir.Join(ir.JoinKind.INNER, left, right, condition)]
    if node.kind in (ir.JoinKind.LEFT, ir.JoinKind.FULL):
        parts.append(
            _pad(ir.Join(ir.JoinKind.ANTI, left, right, condition), left.columns, right.columns, True)
        )
    if node.kind in (ir.JoinKind.RIGHT, ir.JoinKind.FULL):
        parts.append(
            _pad(ir.Join(ir.JoinKind.ANTI, right, left, condition), left.columns, right.columns, False)
        )
    return ir.UnionAll(tuple(parts), node.columns)


def delta(node: ir.Join, ctx: Context) -> ir.Node | None:
    return ctx.delta(expand(node))
