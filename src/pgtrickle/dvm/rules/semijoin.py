"""SEMI and ANTI joins, any predicate (EXISTS, IN, NOT EXISTS, NOT IN with its NULL rules).

``L ⋉ R`` keeps each row ``l`` of ``L`` with its weight when ``l`` matches a row present in ``R``
— linear in ``L``, an existence test ``E(l, R)`` in ``R``. Telescoping as for a join::

    Δ(L ⋉ R) = ΔL ⋉ pre R  ⊎  Σ_l post L(l) · (E(l, post R) − E(l, pre R))

A row ``l`` can change its existence only if it matches a row of ``R`` whose weight changed
(every other matching row is present in ``pre R`` iff in ``post R``). So the second part only
looks at ``Lt = post L ⋉ touched(ΔR)`` — the left rows matching a changed right row::

    (Lt ⋉ post R) ⊎ −(Lt ⋉ pre R)

``ANTI`` is ``L − SEMI``: ``ΔL ▷ pre R ⊎ (Lt ⋉ pre R) ⊎ −(Lt ⋉ post R)``.
"""

from __future__ import annotations

from pgtrickle.dvm import ir
from pgtrickle.dvm.rules.common import Context, touched_rows, union


def delta(node: ir.Join, ctx: Context) -> ir.Node | None:
    d_left, d_right = ctx.delta(node.left), ctx.delta(node.right)
    parts: list[ir.Node] = []
    if d_left is not None:
        parts.append(ir.Join(node.kind, d_left, ctx.pre(node.right), node.condition))
    if d_right is not None:
        candidates = ir.Join(ir.JoinKind.SEMI, ctx.post(node.left), touched_rows(d_right), node.condition)
        gained = ir.Join(ir.JoinKind.SEMI, candidates, ctx.post(node.right), node.condition)
        lost = ir.Join(ir.JoinKind.SEMI, candidates, ctx.pre(node.right), node.condition)
        if node.kind is ir.JoinKind.SEMI:
            parts += [gained, ir.Negate(lost)]
        else:
            parts += [lost, ir.Negate(gained)]
    return union(parts, node.columns)
