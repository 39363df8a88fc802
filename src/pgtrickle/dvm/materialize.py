"""Which nodes of a query's tree become hidden internal stream tables, and why.

Pure decision over the IR. A non-linear node's ``post`` (and ``pre``) is cheap when its
consumer restricts it to touched keys that push down to its input — an aggregate joined on its
group columns reads only the touched groups. Where no such restriction reaches it, the rules
would recompute it whole from its inputs on every refresh; such a node is **materialized**
instead: it becomes a hidden stream table refreshed first, in the same atomic group and at the
same snapshot, so that ``post`` is a table read and ``Δ`` its change buffer. The rules read a
materialized node as ``Materialized(node)`` / ``Materialized(node, pre=True)``; the values are
the same (the delta-rule tests prove every tree with and without it).

The decisions (:func:`decide`), each with its reason:

- :data:`TOPK_INPUT` — the input of a ``TopK``, unless it is a base relation: the visible rows
  depend on all of it (``Δ TopK(X) = −TopK(pre X) ⊎ TopK(post X)``), so it is kept
  incrementally rather than recomputed twice.
- :data:`AGGREGATE_JOINED_ON_VALUES` — an ``Aggregate`` (seen through ``Filter``/``Project``)
  that is an input of a join whose condition uses its aggregate (non-group) columns, or of a
  cross join: the join's touched keys do not select groups, so its value would be computed whole.
- :data:`AGGREGATE_OF_AGGREGATE` — an ``Aggregate`` (through ``Filter``/``Project``) read by
  another ``Aggregate``: the outer one's touched groups do not bound the inner one's.
- :data:`SEMI_JOIN_COUNTS` — the right side of a semi/anti join counted per join key
  (:mod:`pgtrickle.dvm.semijoin_counts`): kept so that its existence flips read it by key.
- :data:`ROOT_STATE` — the state node (:mod:`pgtrickle.dvm.kept_state`) the root reaches through
  ``Filter``/``Project`` nodes, when other nodes are kept: the stream table then stores no state
  of its root aggregate (``dvm/layout.py``), and its touched groups would be recomputed from its
  input; kept, they are read from its table and added to.

The root is never materialized: it is the stream table itself. Where a kept node is a
``Filter``/``Project`` chain over an aggregate's state (:mod:`pgtrickle.dvm.kept_state`), the state
node is kept instead: the chain above it is linear.
"""

from __future__ import annotations

from sqlglot import exp

from pgtrickle.dvm import ir
from pgtrickle.dvm.rules.aggregate import kept_aggregate, original_of
from pgtrickle.dvm.semijoin_counts import is_count

TOPK_INPUT = "the input of a TopK: its visible rows depend on all of it"
AGGREGATE_JOINED_ON_VALUES = "an aggregate joined on its aggregate (non-group) columns or cross joined"
AGGREGATE_OF_AGGREGATE = "an aggregate read by another aggregate"
SEMI_JOIN_COUNTS = "the right side of a semi or anti join, as its rows' count per join key"
ROOT_STATE = "the state of the root aggregate of a query keeping other nodes, maintained from its change"


def _referenced(expression: exp.Expr) -> set[str]:
    return {c.name for c in expression.find_all(exp.Column)}


def trace(node: ir.Node, columns: set[str]) -> tuple[ir.Aggregate, set[str]] | None:
    """The ``Aggregate`` reached from ``node`` through ``Filter``/``Project`` nodes, with the
    aggregate's columns that ``columns`` (of ``node``) are computed from; ``None`` if the chain
    ends at any other node."""
    while True:
        if isinstance(node, ir.Aggregate):
            return node, columns
        if isinstance(node, ir.Filter):
            node = node.input
        elif isinstance(node, ir.Project):
            wanted = set()
            for name, expression in node.outputs:
                if name in columns:
                    wanted |= _referenced(expression)
            node, columns = node.input, wanted
        else:
            return None


def _value_columns(aggregate: ir.Aggregate) -> set[str]:
    return {name for name, _ in aggregate.aggregates}


def decide(root: ir.Node) -> dict[ir.Node, str]:
    """``{node: reason}`` for the nodes of ``root``'s tree to keep as hidden stream tables."""
    out: dict[ir.Node, str] = {}
    for node in ir.walk(root):
        if isinstance(node, ir.TopK) and not isinstance(node.input, (ir.Scan, ir.Values)):
            out.setdefault(node.input, TOPK_INPUT)
        elif isinstance(node, ir.Join):
            if node.kind in (ir.JoinKind.SEMI, ir.JoinKind.ANTI):
                counted = trace(node.right, set(node.right.columns))
                if counted is not None and is_count(counted[0]):
                    out.setdefault(counted[0], SEMI_JOIN_COUNTS)
            used = None if node.condition is None else _referenced(node.condition)
            for side in (node.left, node.right):
                found = trace(side, set(side.columns) if used is None else used & set(side.columns))
                if found is not None and (used is None or found[1] & _value_columns(found[0])):
                    out.setdefault(found[0], AGGREGATE_JOINED_ON_VALUES)
        elif isinstance(node, ir.Aggregate):
            found = trace(node.input, set(node.input.columns))
            if found is not None:
                out.setdefault(found[0], AGGREGATE_OF_AGGREGATE)
    out.pop(root, None)
    for node, reason in list(out.items()):
        chained = kept_aggregate(node)
        if chained is not None and chained.chain and original_of(chained.aggregate) is not None:
            del out[node]
            out.setdefault(chained.aggregate, reason)
    top = root
    while isinstance(top, (ir.Filter, ir.Project)):
        top = top.input
    if out and top is not root and original_of(top) is not None:
        out.setdefault(top, ROOT_STATE)
    return out
