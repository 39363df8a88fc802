"""The delta rules of the compositional engine, folded over the operator tree.

:func:`delta` returns the plan — an IR tree of ordinary nodes, ``Delta`` (a base relation's
change buffer), ``Negate`` and ``Materialized`` (a hidden stream table) — whose value is the
node's change over the refresh window, or ``None`` when no relation under it is in ``changed``.
One module per operator holds its rule (see each module's docstring for what it computes and
why it is right); the fold gives every rule three things about an input, memoized per node so a
shared subtree is planned once:

- ``post(n)``: its value at the refresh snapshot — the node itself, with every materialized node
  under it read from its hidden table (``Materialized(m)``);
- ``delta(n)``: its change (the rule's plan; for a materialized node its change buffer,
  ``Materialized(m, change=True)``, whose value is ``Materialized(m) ⊎ −Materialized(m, pre=True)``);
- ``pre(n)``: its value at the window's start — ``post(n) ⊎ −delta(n)`` (a ``UnionAll`` with a
  ``Negate``), ``Materialized(m, pre=True)`` for a materialized node, and simply ``post(n)``
  when nothing under it changed. It is built only where a rule asks for it.

``materialized`` are the nodes kept as hidden stream tables (the keys of
:func:`pgtrickle.dvm.materialize.decide`); the root is never read as one of them. With
``stored_state``, the root is itself kept with its hidden state (the stream table being
refreshed): an invertible Aggregate root then uses the algebraic rule over
``Materialized(state_node(root), pre=True)`` instead of recomputing its touched groups.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection

from pgtrickle.dvm import ir
from pgtrickle.dvm.rules import (
    aggregate,
    distinct,
    filter,
    join,
    outerjoin,
    project,
    scan,
    semijoin,
    setop,
    topk,
    union,
    values,
    window,
)
from pgtrickle.errors import UnsupportedQueryError

_INPUT_FIELDS: dict[type[ir.Node], tuple[str, ...]] = {
    ir.Filter: ("input",),
    ir.Project: ("input",),
    ir.Aggregate: ("input",),
    ir.Distinct: ("input",),
    ir.Window: ("input",),
    ir.TopK: ("input",),
    ir.Join: ("left", "right"),
    ir.SetOp: ("left", "right"),
}


def _join_rule(node: ir.Join, ctx: _Fold) -> ir.Node | None:
    if node.kind is ir.JoinKind.INNER:
        return join.delta(node, ctx)
    if node.kind in (ir.JoinKind.SEMI, ir.JoinKind.ANTI):
        return semijoin.delta(node, ctx)
    return outerjoin.delta(node, ctx)


_RULES: dict[type[ir.Node], Callable[..., ir.Node | None]] = {
    ir.Scan: scan.delta,
    ir.Values: values.delta,
    ir.Filter: filter.delta,
    ir.Project: project.delta,
    ir.UnionAll: union.delta,
    ir.Join: _join_rule,
    ir.Aggregate: aggregate.delta,
    ir.Distinct: distinct.delta,
    ir.SetOp: setop.delta,
    ir.Window: window.delta,
    ir.TopK: topk.delta,
}


class _Fold:
    def __init__(self, root: ir.Node, changed: frozenset[str], materialized: Collection[ir.Node]) -> None:
        self.root = root
        self.changed = changed
        self.materialized = {m for m in materialized if m is not root}
        # Keyed by the node itself (identity hash), not id(): the memo keeps every node it has
        # seen alive, so a node a rule built and dropped cannot lend its id to another.
        self._touched: dict[ir.Node, bool] = {}
        self._delta: dict[ir.Node, ir.Node | None] = {}
        self._pre: dict[ir.Node, ir.Node] = {}
        self._post: dict[ir.Node, ir.Node] = {}

    def touched(self, node: ir.Node) -> bool:
        key = node
        if key not in self._touched:
            if isinstance(node, ir.Scan):
                self._touched[key] = node.relation in self.changed
            else:
                self._touched[key] = any(self.touched(child) for child in node.inputs)
        return self._touched[key]

    def delta(self, node: ir.Node) -> ir.Node | None:
        key = node
        if key not in self._delta:
            self._delta[key] = self._plan(node)
        return self._delta[key]

    def _plan(self, node: ir.Node) -> ir.Node | None:
        if isinstance(node, (ir.Delta, ir.Negate, ir.Materialized)):
            raise UnsupportedQueryError(
                f"{type(node).__name__} belongs to delta plans, not to a query's tree"
            )
        rule = _RULES.get(type(node))
        if rule is None:
            raise UnsupportedQueryError(f"no delta rule for the operator {type(node).__name__}")
        if not self.touched(node):
            return None
        if node in self.materialized:
            return ir.Materialized(node, change=True)
        return rule(node, self)

    def post(self, node: ir.Node) -> ir.Node:
        key = node
        if key not in self._post:
            if key in self.materialized:
                self._post[key] = ir.Materialized(node)
            else:
                self._post[key] = self._rebuild(node)
        return self._post[key]

    def _rebuild(self, node: ir.Node) -> ir.Node:
        """``node`` with its inputs replaced by their ``post`` (the same object if none differs)."""
        if isinstance(node, ir.UnionAll):
            branches = tuple(self.post(b) for b in node.branches)
            same = all(a is b for a, b in zip(branches, node.branches, strict=True))
            return node if same else ir.UnionAll(branches, node.output)
        fields = _INPUT_FIELDS.get(type(node), ())
        changes = {f: self.post(getattr(node, f)) for f in fields}
        if all(changes[f] is getattr(node, f) for f in fields):
            return node
        return dataclasses.replace(node, **changes)

    def _over_materialized(self, node: ir.Node) -> bool:
        while isinstance(node, (ir.Filter, ir.Project)):
            node = node.input
        return node in self.materialized

    def pre(self, node: ir.Node) -> ir.Node:
        key = node
        if key not in self._pre:
            change = self.delta(node)
            if change is None:
                self._pre[key] = self.post(node)
            elif key in self.materialized:
                self._pre[key] = ir.Materialized(node, pre=True)
            elif isinstance(node, (ir.Filter, ir.Project)) and self._over_materialized(node):
                # Linear over a hidden table: the table as stored, through the same chain.
                self._pre[key] = dataclasses.replace(node, input=self.pre(node.input))
            else:
                self._pre[key] = ir.UnionAll((self.post(node), ir.Negate(change)), node.columns)
        return self._pre[key]


def delta(
    node: ir.Node,
    changed: frozenset[str],
    materialized: Collection[ir.Node] = (),
    *,
    stored_state: bool = False,
) -> ir.Node | None:
    """The plan of ``node``'s change over the window, ``None`` when nothing under it changed.

    ``changed``: the ``Scan.relation``\\ s with pending changes. ``materialized``: nodes read as
    hidden stream tables. ``stored_state``: the root is kept with its hidden state, so an
    invertible Aggregate root takes the algebraic rule.
    """
    fold = _Fold(node, frozenset(changed), materialized)
    if stored_state and isinstance(node, ir.Aggregate) and aggregate.invertible(node):
        return aggregate.algebraic(node, fold)
    return fold.delta(node)


def delta_kept(
    node: ir.Node, changed: frozenset[str], materialized: Collection[ir.Node] = ()
) -> ir.Node | None:
    """The change of ``node``, kept in a hidden state table (``materialized``: the nodes kept
    under it). An aggregate (through ``Filter``/``Project`` keeping its group keys) reads the old
    rows of its touched groups from its own table, ``Materialized(node, pre=True)``
    (:func:`aggregate.recompute_kept`); the state of an additive aggregate
    (:mod:`pgtrickle.dvm.kept_state`) takes the algebraic rule over its own table
    (:func:`aggregate.delta_state`); any other node takes its rule, as :func:`delta`."""
    fold = _Fold(node, frozenset(changed), materialized)
    if not fold.touched(node):
        return None
    original = aggregate.original_of(node)
    if original is not None:  # the state of an additive aggregate (pgtrickle.dvm.kept_state)
        return aggregate.delta_state(original, fold)
    found = aggregate.kept_aggregate(node)
    if found is None:
        return fold.delta(node)
    return aggregate.recompute_kept(node, found, fold)


def delta_state(
    node: ir.Aggregate, changed: frozenset[str], materialized: Collection[ir.Node] = ()
) -> ir.Node | None:
    """The plan of the change of ``node``'s stored state (:func:`aggregate.state_node`; ``node``
    must be :func:`aggregate.invertible`): the algebraic rule over the state at the window's
    start, ``Materialized(state_node(node), pre=True)`` — the stream table itself."""
    return aggregate.delta_state(node, _Fold(node, frozenset(changed), materialized))


def pre(node: ir.Node, changed: frozenset[str], materialized: Collection[ir.Node] = ()) -> ir.Node:
    """The plan of ``node``'s value at the window's start (``post ⊎ −Δ``)."""
    return _Fold(node, frozenset(changed), materialized).pre(node)


__all__ = ["delta", "delta_kept", "delta_state", "pre"]
