"""Kept aggregates with an additive state: the hidden table keeps the state, maintained algebraically.

Pure: no I/O. :func:`pgtrickle.dvm.materialize.decide` keeps an aggregate (seen through
``Filter``/``Project`` nodes) in a hidden table when no consumer restricts it to its touched
groups. By default its change recomputes those groups from the input's value at the snapshot
(:func:`pgtrickle.dvm.rules.aggregate.recompute_kept`): every input row of every touched group is
read, which over a join of large tables is most of them.

When every aggregate is ``COUNT`` or ``SUM`` (no ``DISTINCT``; ``FILTER`` allowed) and no sum adds
floating-point values (:func:`pgtrickle.dvm.stored.not_storable`: accumulated, they would drift
from a recomputation in the last bits), the table keeps the aggregate's **state** instead —
:func:`~pgtrickle.dvm.rules.aggregate.state_node`: its columns, each SUM's count of non-NULL
values and the group's row count — and the state's change is the algebraic one
(:func:`~pgtrickle.dvm.rules.aggregate.delta_state`): the old state of the touched groups read
from the table, plus the aggregate of the input's change. No input row outside the change is read.

:func:`rewrite` puts this in the tree: such an aggregate ``a`` becomes ``visible(a,
state_node(a))`` — a projection of its state, the same value — so that
:func:`~pgtrickle.dvm.materialize.decide`, run again, keeps the state node, and the rules
(:func:`pgtrickle.dvm.rules.delta_kept`) recognise it (:func:`~pgtrickle.dvm.rules.aggregate.original_of`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from pgtrickle.dvm import ir, ir_rewrite
from pgtrickle.dvm.rules import aggregate
from pgtrickle.errors import UnsupportedQueryError

__all__ = ["keeps_state", "rewrite", "root_aggregate"]


def keeps_state(node: ir.Aggregate, exact: Callable[[ir.Aggregate], bool]) -> bool:
    """Whether the kept aggregate ``node`` keeps its state: additive, and ``exact(node)``."""
    if aggregate.original_of(node) is not None:
        return False  # already a state
    try:
        return aggregate.additive(node) and exact(node)
    except UnsupportedQueryError:  # an aggregate split_aggregate does not know
        return False


def rewrite(tree: ir.Node, kept: Collection[ir.Node], exact: Callable[[ir.Aggregate], bool]) -> ir.Node:
    """``tree`` with every aggregate that a node of ``kept`` reaches through ``Filter``/``Project``
    nodes (:func:`~pgtrickle.dvm.rules.aggregate.kept_aggregate`) and that :func:`keeps_state`
    replaced by the projection of its state (``tree`` itself when there is none)."""
    swap: dict[int, Callable[[ir.Node], ir.Node]] = {}
    for node in kept:
        found = aggregate.kept_aggregate(node)
        if found is None or found.aggregate is tree or not keeps_state(found.aggregate, exact):
            continue
        swap[id(found.aggregate)] = _as_state
    if swap:
        # Bottom up: a kept aggregate under another one (a semi join's counts inside the right
        # side of another's) is a state in the outer one's state too, not recomputed there.
        tree = ir_rewrite.swap_bottom_up(tree, swap)
    root = root_aggregate(tree)
    if kept and root is not None and keeps_state(root, exact):
        # The stream table stores no state of its root aggregate when the query keeps other
        # nodes (dvm/layout.py): without one, its touched groups are recomputed from its input,
        # a hidden table read whole (TPC-H Q13's customers per order count). Kept as a state too.
        tree = ir_rewrite.replace_nodes(tree, {id(root): aggregate.visible(root, aggregate.state_node(root))})
    return tree


def _as_state(node: ir.Node) -> ir.Node:
    assert isinstance(node, ir.Aggregate)
    return aggregate.visible(node, aggregate.state_node(node))


def root_aggregate(tree: ir.Node) -> ir.Aggregate | None:
    """The aggregate the root of ``tree`` is, or reaches through ``Filter``/``Project`` nodes."""
    node = tree
    while isinstance(node, (ir.Filter, ir.Project)):
        node = node.input
    return node if isinstance(node, ir.Aggregate) else None
