"""Filter is linear: ``Δσ(X) = σ(ΔX)`` — the predicate keeps a row, with its weight, or drops it,
whatever the sign of the weight."""

from __future__ import annotations

from pgtrickle.dvm import ir
from pgtrickle.dvm.rules.common import Context


def delta(node: ir.Filter, ctx: Context) -> ir.Node | None:
    change = ctx.delta(node.input)
    return None if change is None else ir.Filter(change, node.predicate)
