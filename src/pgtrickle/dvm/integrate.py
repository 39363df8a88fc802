"""Hidden state tables: a materialized node's value is its stored value plus its change.

Pure: no I/O. The delta rules read a node kept as a hidden table (:mod:`pgtrickle.dvm.materialize`)
as ``Materialized(m, pre=True)`` — the table as stored, which holds ``m``'s value at the window's
start —, ``Materialized(m)`` — its value at the refresh snapshot — and ``Materialized(m,
change=True)`` — its change over the window (its change buffer). The table is brought to the
snapshot by the same refresh that reads it, in the same transaction as the stream table it
serves, so nothing can read its value at the snapshot from storage: it is **integrated**,

    post(m) = stored(m) ⊎ Δ(m)

where ``Δ(m)`` is the plan the rules make of ``m``'s own subtree (itself reading the hidden
tables under ``m`` the same way). :func:`integrate` rewrites a delta plan so that it reads the
hidden tables only as stored and their changes as change buffers, and returns each hidden
table's change plan, which the refresh runs first (children first) and applies to that table
alongside the stream table's own (DBSP calls this an integral).

The change of ``m`` stays a leaf, ``Materialized(m, change=True)``, in every plan that reads it;
it is never replaced by the plan computing it. The refresh computes each change once, then
hands it to the plans above as a relation of its own. Inlining the plan instead (as an earlier
version did) repeats it wherever the rules read ``post(m)`` or ``Δ(m)``: Spark inlines every
common table expression, so an aggregate of an aggregate over an outer join became a tree of
1,744 operators that Spark's analyzer and optimizer did not get through in 10 minutes.

A hidden table therefore shares its stream table's frontier: it holds ``m``'s value at the
stream table's last refresh, and a FULL refresh of the stream table rebuilds it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from pgtrickle.dvm import ir, ir_rewrite, rules

__all__ = ["Integrated", "integrate", "substitute_post"]


@dataclass(frozen=True)
class Integrated:
    """A delta plan that reads hidden tables only as stored, and the change of each.

    ``plan``: the root's change (``None``: nothing under it changed). ``changes``: per
    materialized node, children first, the plan of its change (``None``: unchanged) — what the
    refresh applies to its hidden table. Both read a materialized node only as stored
    (``Materialized(m, pre=True)``) and as its change (``Materialized(m, change=True)``, which
    ``changes`` computes before any plan reads it).
    """

    plan: ir.Node | None
    changes: tuple[tuple[ir.Node, ir.Node | None], ...]


def substitute_post(plan: ir.Node, posts: Mapping[ir.Node, ir.Node]) -> ir.Node:
    """``plan`` with every ``Materialized(m)`` (not ``pre``) of a node ``m`` in ``posts``
    replaced by ``posts[m]``; one replacement object per ``m``, so it is compiled once."""
    replace: dict[int, ir.Node] = {}
    for n in ir.walk(plan):
        if isinstance(n, ir.Materialized) and not n.pre and not n.change and n.node in posts:
            replace[id(n)] = posts[n.node]
    if not replace:
        return plan
    return ir_rewrite.replace_nodes(plan, replace)


def integrate(
    root: ir.Node,
    changed: frozenset[str],
    materialized: Collection[ir.Node],
    *,
    stored_state: bool = False,
) -> Integrated:
    """The change of ``root`` over the window with the nodes ``materialized`` kept as hidden
    tables read only as stored (see the module docstring); ``changed`` and ``stored_state`` as
    :func:`pgtrickle.dvm.rules.delta` takes them."""
    wanted = set(materialized)
    hidden = [n for n in ir.walk(root) if n in wanted and n is not root]
    posts: dict[ir.Node, ir.Node] = {}
    changes: list[tuple[ir.Node, ir.Node | None]] = []
    for m in hidden:  # children first: a node's change reads the ones under it, already integrated
        inner = [n for n in hidden if n is not m]
        change = rules.delta_kept(m, changed, inner)
        if change is not None:
            change = substitute_post(change, posts)
        stored = ir.Materialized(m, pre=True)
        if change is None:
            posts[m] = stored
        else:
            posts[m] = ir.UnionAll((stored, ir.Materialized(m, change=True)), m.columns)
        changes.append((m, change))
    plan = rules.delta(root, changed, hidden, stored_state=stored_state)
    if plan is not None:
        plan = substitute_post(plan, posts)
    return Integrated(plan, tuple(changes))
