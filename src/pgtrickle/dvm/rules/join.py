"""Inner (and cross) join, any predicate: the **telescoping** rule.

A join is bilinear in its inputs, so over a window where ``L`` goes from ``pre L`` to
``post L = pre L ⊎ ΔL`` (and likewise ``R``)::

    post L ⋈ post R − pre L ⋈ pre R = ΔL ⋈ pre R  ⊎  post L ⋈ ΔR

(add and subtract ``post L ⋈ pre R``). An unchanged input contributes no term and its ``pre``
is its ``post``. Nested over an n-way join, with the left input's change itself a sum of terms
distributed over the join, this gives exactly one term per *changed* input — the input's Δ
joined with ``post`` of the inputs before it and ``pre`` of those after — never the
inclusion–exclusion's 2^k − 1 terms: for ``((A ⋈ B) ⋈ C)``::

    ΔA ⋈ pre B ⋈ pre C  ⊎  post A ⋈ ΔB ⋈ pre C  ⊎  post A ⋈ post B ⋈ ΔC
"""

from __future__ import annotations

from pgtrickle.dvm import ir
from pgtrickle.dvm.rules.common import Context, union


def _terms(change: ir.Node) -> tuple[ir.Node, ...]:
    """A change that is a sum of terms with the same columns, as its terms (to distribute)."""
    if isinstance(change, ir.UnionAll) and all(b.columns == change.columns for b in change.branches):
        return change.branches
    return (change,)


def delta(node: ir.Join, ctx: Context) -> ir.Node | None:
    d_left, d_right = ctx.delta(node.left), ctx.delta(node.right)
    parts: list[ir.Node] = []
    if d_left is not None:
        pre_right = ctx.pre(node.right)
        parts += [ir.Join(ir.JoinKind.INNER, t, pre_right, node.condition) for t in _terms(d_left)]
    if d_right is not None:
        post_left = ctx.post(node.left)
        parts += [ir.Join(ir.JoinKind.INNER, post_left, t, node.condition) for t in _terms(d_right)]
    return union(parts, node.columns)
