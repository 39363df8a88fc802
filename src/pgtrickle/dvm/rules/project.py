"""Project is linear: ``Δπ(X) = π(ΔX)`` — each row maps to one row with the same weight
(expressions, CASE, casts: any deterministic scalar expression)."""

from __future__ import annotations

from pgtrickle.dvm import ir
from pgtrickle.dvm.rules.common import Context


def delta(node: ir.Project, ctx: Context) -> ir.Node | None:
    change = ctx.delta(node.input)
    return None if change is None else ir.Project(change, node.outputs)
