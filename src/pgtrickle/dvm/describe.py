"""Render a defining query's operator tree as text, for ``pgtrickle explain``.

Pure: no I/O. One line per node, root first, children indented two spaces under their parent::

    TopK order: revenue DESC, o_orderdate limit 10  [delta: visible rows before and after]
      Project revenue = ..., o_orderdate = ...  [delta: linear; materialized: the input of ...]

Each line holds the operator, its key facts (join kind and condition, group keys and aggregates,
predicate, sort keys and limit, ...), the rule that computes its change
(:func:`pgtrickle.dvm.pipeline.rule_of`) and, for a node kept as a hidden stream table,
``materialized: <reason>`` (:func:`pgtrickle.dvm.materialize.decide`). A subtree the lowering
shares between two consumers is rendered once; its second reader shows ``(shared: see above)``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from sqlglot import exp

from pgtrickle.dvm import ir, materialize
from pgtrickle.dvm.pipeline import DeltaPlan, Step, steps_of

__all__ = ["describe", "describe_plan", "facts"]

_WIDTH = 160
"""Longest rendering of one node's facts; longer ones are cut with an ellipsis."""


def _sql(expression: exp.Expr) -> str:
    return expression.sql(dialect="postgres")


def _named(named: ir.Named) -> str:
    return ", ".join(
        name if isinstance(e, exp.Column) and e.name == name else f"{name} = {_sql(e)}" for name, e in named
    )


def facts(node: ir.Node) -> str:
    """The operator and its key facts, on one line."""
    if isinstance(node, ir.Scan):
        text = f"Scan {node.relation} ({', '.join(node.source_columns)})"
    elif isinstance(node, ir.Values):
        text = f"Values {len(node.rows)} row(s) ({', '.join(node.output)})"
    elif isinstance(node, ir.Filter):
        text = f"Filter {_sql(node.predicate)}"
    elif isinstance(node, ir.Project):
        text = f"Project {_named(node.outputs)}"
    elif isinstance(node, ir.UnionAll):
        text = f"UnionAll {len(node.branches)} branches"
    elif isinstance(node, ir.Join):
        on = "cross" if node.condition is None else f"on {_sql(node.condition)}"
        text = f"Join {node.kind.value.upper()} {on}"
    elif isinstance(node, ir.Aggregate):
        keys = _named(node.keys) if node.keys else "(none: one row)"
        text = f"Aggregate group by {keys}; {_named(node.aggregates)}"
    elif isinstance(node, ir.Distinct):
        text = f"Distinct ({', '.join(node.columns)})"
    elif isinstance(node, ir.SetOp):
        text = f"SetOp {node.kind.value.upper()}{' ALL' if node.all else ''}"
    elif isinstance(node, ir.Window):
        text = f"Window {_named(node.functions)}"
    elif isinstance(node, ir.TopK):
        order = ", ".join(_sql(o) for o in node.order)
        text = f"TopK order by {order}"
        if node.limit is not None:
            text += f" limit {node.limit}"
        if node.offset:
            text += f" offset {node.offset}"
    else:
        text = type(node).__name__
    return text if len(text) <= _WIDTH else text[: _WIDTH - 1] + "…"


def _line(step: Step, depth: int) -> str:
    note = f"delta: {step.rule}"
    if step.materialized:
        note += f"; materialized: {step.materialized}"
    return f"{'  ' * depth}{facts(step.node)}  [{note}]"


def describe_plan(plan: DeltaPlan) -> str:
    """The tree of a :class:`DeltaPlan`, with the rules that ran for its window's changes."""
    return _render(plan.tree, {id(s.node): s for s in plan.steps})


def describe(
    tree: ir.Node,
    *,
    changed: Collection[str] | None = None,
    materialized: Mapping[ir.Node, str] | None = None,
    stored_state: bool = False,
) -> str:
    """The tree of a lowered query (``changed=None``: as if every relation changed;
    ``materialized``: :func:`pgtrickle.dvm.materialize.decide`'s by default)."""
    decided = materialize.decide(tree) if materialized is None else materialized
    steps = steps_of(tree, decided, changed=changed, stored_state=stored_state)
    return _render(tree, {id(s.node): s for s in steps})


def _render(tree: ir.Node, steps: Mapping[int, Step]) -> str:
    lines: list[str] = []
    seen: set[int] = set()
    stack: list[tuple[ir.Node, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if id(node) in seen:
            lines.append(f"{'  ' * depth}{facts(node)}  (shared: see above)")
            continue
        seen.add(id(node))
        lines.append(_line(steps[id(node)], depth))
        stack.extend((child, depth + 1) for child in reversed(node.inputs))
    return "\n".join(lines)
