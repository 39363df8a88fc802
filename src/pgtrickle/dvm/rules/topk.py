"""TopK (ORDER BY … OFFSET … LIMIT): which rows are visible depends on every row of the input,
so the change is the difference of the visible rows::

    Δ TopK(X) = −TopK(pre X) ⊎ TopK(post X)

cheap when ``X`` is kept incrementally: :mod:`pgtrickle.dvm.materialize` makes a TopK's
(non-scan) input a hidden stream table, and then ``pre X`` and ``post X`` are reads of its stored
state and of its value at the snapshot.
"""

from __future__ import annotations

from pgtrickle.dvm import ir
from pgtrickle.dvm.rules.common import Context, minus


def delta(node: ir.TopK, ctx: Context) -> ir.Node | None:
    if ctx.delta(node.input) is None:
        return None

    def at(value: ir.Node) -> ir.Node:
        return ir.TopK(value, node.order, node.limit, node.offset)

    return minus(at(ctx.post(node.input)), at(ctx.pre(node.input)), node.columns)
