"""What every delta rule uses: the fold's interface (:class:`Context`) and small plan builders.

A rule is a pure function ``delta(node, ctx) -> Node | None`` that returns the plan of
``node``'s change over the refresh window, built from ordinary IR nodes, ``Delta``, ``Negate``
and ``Materialized``. It asks the fold (``ctx``) for its inputs' ``post`` (their value at the
refresh snapshot), ``pre`` (their value at the window's start, derived as ``post ⊎ −Δ``, or a
hidden table's stored state) and ``delta`` (``None`` when nothing under the input changed).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from sqlglot import exp

from pgtrickle.dvm import ir


class Context(Protocol):
    """The fold over the tree, as the rules see it (memoized per node)."""

    def delta(self, node: ir.Node) -> ir.Node | None: ...

    def pre(self, node: ir.Node) -> ir.Node: ...

    def post(self, node: ir.Node) -> ir.Node: ...


def col(name: str) -> exp.Column:
    return exp.column(name)


def fresh(base: str, taken: Iterable[str], count: int) -> tuple[str, ...]:
    """``count`` column names ``__pgt_<base><i>`` none of which is in ``taken``."""
    used = set(taken)
    names: list[str] = []
    i = 0
    while len(names) < count:
        name = f"__pgt_{base}{i}"
        if name not in used:
            names.append(name)
        i += 1
    return tuple(names)


def union(parts: Sequence[ir.Node | None], columns: tuple[str, ...]) -> ir.Node | None:
    """The sum of the non-``None`` ``parts``, named ``columns`` (``None`` when there is none; a
    single part is itself when it already has those names)."""
    kept = [p for p in parts if p is not None]
    if not kept:
        return None
    if len(kept) == 1 and kept[0].columns == columns:
        return kept[0]
    return ir.UnionAll(tuple(kept), columns)


def minus(post: ir.Node, pre: ir.Node, columns: tuple[str, ...]) -> ir.Node:
    """``post ⊎ −pre``: the change between two values of the same node."""
    return ir.UnionAll((ir.Negate(pre), post), columns)


def touched_rows(change: ir.Node) -> ir.Node:
    """The rows whose weight in ``change`` is not zero, once each: the inserted ones (positive
    net weight) and the deleted ones (negative), each a set, and disjoint."""
    return ir.UnionAll((ir.Distinct(change), ir.Distinct(ir.Negate(change))), change.columns)


def touched_keys(change: ir.Node, keys: Sequence[exp.Expr], taken: Iterable[str]) -> ir.Node:
    """The distinct values of ``keys`` (expressions over ``change``'s columns) over the rows
    ``change`` touches — including a group whose net change is zero (an update inside it) —
    named ``__pgt_k<i>``, avoiding ``taken``."""
    names = fresh("k", [*taken, *change.columns], len(keys))
    return ir.Distinct(ir.Project(touched_rows(change), tuple(zip(names, keys, strict=True))))


def null_safe_match(exprs: Sequence[exp.Expr], names: Sequence[str]) -> exp.Expr:
    """``e1 IS NOT DISTINCT FROM k1 AND …``: NULL keys match NULL keys, as GROUP BY groups them."""
    terms = [exp.NullSafeEQ(this=e.copy(), expression=col(n)) for e, n in zip(exprs, names, strict=True)]
    return exp.and_(*terms) if len(terms) > 1 else terms[0]


def restrict(node: ir.Node, keys: ir.Node, exprs: Sequence[exp.Expr]) -> ir.Node:
    """``node ⋉ keys``: the rows of ``node`` whose ``exprs`` equal (null-safe) a row of ``keys``."""
    return ir.Join(ir.JoinKind.SEMI, node, keys, null_safe_match(exprs, keys.columns))
