"""UnionAll is linear: ``Δ(A ⊎ B) = ΔA ⊎ ΔB`` — an unchanged branch contributes no term."""

from __future__ import annotations

from pgtrickle.dvm import ir
from pgtrickle.dvm.rules.common import Context, union


def delta(node: ir.UnionAll, ctx: Context) -> ir.Node | None:
    return union([ctx.delta(branch) for branch in node.branches], node.output)
