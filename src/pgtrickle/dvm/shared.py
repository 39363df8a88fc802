"""Sub-plans a refresh computes once, first, and reads as relations of their own (pure).

A compiled plan is one query whose every node is a common table expression (CTE). Spark inlines
each CTE at every place that reads it, so a sub-plan read along k paths of the tree is optimized
k times, and planning time grows with the *inlined* tree, not with the plan: the change of
TPC-H Q13's kept aggregate was 36 distinct nodes but 241 operators inlined, and Spark spent
longer planning it than running it.

:func:`choose` picks the nodes worth computing first: each one

- is **bounded by the change** (:func:`bounded`): its rows come from a change (a change buffer,
  a hidden table's change) through filters, projections, inner and semi joins with a bounded
  side (the rows of a table matching a change's keys), aggregates and the like, so collecting
  it costs little;
- is read along two or more paths, and computing it first shrinks the operators Spark plans in
  all (the plan's own and those of the nodes computed first) by at least :data:`MIN_SAVING`.

It is greedy: the node saving most first, until none saves enough. :func:`split` turns a
compiled plan and the chosen nodes into the queries to run: one per chosen node (children
first), then the plan's own, each reading a chosen node's relation (``view_of(i)``) instead of
its CTE, and each keeping only the CTEs it reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlglot import exp

from pgtrickle.dvm import ir
from pgtrickle.dvm.compile import Compiled
from pgtrickle.dvm.compile_sql import columns_of, select, table, weight

__all__ = [
    "MIN_SAVING",
    "Split",
    "bounded",
    "choose",
    "inlined_size",
    "root_split",
    "split",
    "split_at_choice",
]

MIN_SAVING = 24
"""Operators a node computed first must save (each one costs a Spark job of its own)."""


def bounded(node: ir.Node, memo: dict[ir.Node, bool] | None = None) -> bool:
    """Whether ``node``'s rows are bounded by the window's change rather than by a table (pure)."""
    memo = {} if memo is None else memo
    if node in memo:
        return memo[node]
    result: bool
    if isinstance(node, ir.Delta | ir.Values | ir.TopK):
        result = True
    elif isinstance(node, ir.Materialized):
        result = node.change
    elif isinstance(node, ir.Scan):
        result = False
    elif isinstance(node, ir.Aggregate):
        result = not node.keys or bounded(node.input, memo)
    elif isinstance(node, ir.UnionAll):
        result = all(bounded(b, memo) for b in node.branches)
    elif isinstance(node, ir.Join):
        left, right = bounded(node.left, memo), bounded(node.right, memo)
        result = {
            ir.JoinKind.INNER: left or right,
            ir.JoinKind.SEMI: left or right,
            ir.JoinKind.ANTI: left,
            ir.JoinKind.LEFT: left,
            ir.JoinKind.RIGHT: right,
            ir.JoinKind.FULL: left and right,
        }[node.kind]
    elif isinstance(node, ir.SetOp):
        result = bounded(node.left, memo) and (node.kind is ir.SetOpKind.EXCEPT or bounded(node.right, memo))
    else:  # Filter, Project, Negate, Distinct, Window: as their input
        result = all(bounded(i, memo) for i in node.inputs)
    memo[node] = result
    return result


def inlined_size(root: ir.Node, leaves: Sequence[ir.Node] = ()) -> int:
    """The operators of ``root``'s tree with every shared subtree inlined at each place that
    reads it; a node of ``leaves`` (other than ``root``) counts as one read (pure)."""
    stop = {id(n) for n in leaves if n is not root}
    memo: dict[int, int] = {}
    for node in ir.walk(root):  # children first
        if id(node) in stop:
            memo[id(node)] = 1
        else:
            memo[id(node)] = 1 + sum(memo[id(child)] for child in node.inputs)
    return memo[id(root)]


def _cost(root: ir.Node, chosen: Sequence[ir.Node]) -> int:
    return sum(inlined_size(r, chosen) for r in (root, *chosen))


def choose(root: ir.Node, min_saving: int = MIN_SAVING) -> tuple[ir.Node, ...]:
    """The nodes of ``root``'s plan to compute first, children first (see the module docstring)."""
    memo: dict[ir.Node, bool] = {}
    candidates = [n for n in ir.walk(root) if n is not root and n.inputs and bounded(n, memo)]
    chosen: list[ir.Node] = []
    cost = _cost(root, chosen)
    while True:
        best, best_cost = None, cost - min_saving + 1
        for node in candidates:
            if node in chosen:
                continue
            trial = _cost(root, [*chosen, node])
            if trial < best_cost:
                best, best_cost = node, trial
        if best is None:
            break
        chosen.append(best)
        cost = best_cost
    order = {id(n): i for i, n in enumerate(ir.walk(root))}
    return tuple(sorted(chosen, key=lambda n: order[id(n)]))


@dataclass(frozen=True)
class Split:
    """The queries of a plan split at its chosen nodes: ``first`` (per chosen node, children
    first: the relation to register it as and the query computing it), then ``main``;
    ``whole``: the plan unsplit (the same change in one query)."""

    first: tuple[tuple[str, Compiled], ...]
    main: Compiled
    whole: Compiled


def _references(query: exp.Expr, names: set[str]) -> set[str]:
    return {t.name for t in query.find_all(exp.Table) if not t.db and t.name in names}


def split(compiled: Compiled, chosen: Sequence[ir.Node], view_of: Callable[[int], str]) -> Split:
    """``compiled`` (with its :attr:`~Compiled.nodes`) split at ``chosen`` (children first);
    ``view_of(i)``: the relation the ``i``-th chosen node is read from (pure)."""
    query = compiled.query.copy()
    with_ = query.find(exp.With)
    if with_ is None or not chosen:
        return Split((), compiled, compiled)
    ctes: dict[str, exp.CTE] = {cte.alias: cte for cte in with_.expressions}
    index = {id(node): i for i, node in enumerate(compiled.nodes)}
    bodies = {name: cte.this for name, cte in ctes.items()}
    names = set(ctes)
    first: list[tuple[str, Compiled]] = []
    for i, node in enumerate(chosen):
        own = f"__pgt_n{index[id(node)]}"
        computing = select([*columns_of(node.columns), weight()], table(own))
        first.append((view_of(i), _with(computing, own, bodies, names, node.columns, compiled)))
        bodies[own] = select([*columns_of(node.columns), weight()], table(view_of(i)))
    outer = query
    needed = _closure(_references(_strip_with(outer), names), bodies, names)
    with_.set("expressions", [_cte(name, bodies[name]) for name in ctes if name in needed])
    main = Compiled(outer, compiled.columns, compiled.reads, compiled.dialect, compiled.nodes)
    return Split(tuple(first), main, compiled)


def _strip_with(query: exp.Expr) -> exp.Expr:
    """``query`` without its WITH clause (to find what the query itself reads)."""
    copy = query.copy()
    found = copy.find(exp.With)
    if found is not None:
        found.pop()
    return copy


def _closure(start: set[str], bodies: dict[str, exp.Expr], names: set[str]) -> set[str]:
    needed, stack = set(), list(start)
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        needed.add(name)
        stack.extend(_references(bodies[name], names) - needed)
    return needed


def _cte(name: str, body: exp.Expr) -> exp.CTE:
    return exp.CTE(this=body.copy(), alias=exp.TableAlias(this=exp.Identifier(this=name, quoted=True)))


def _with(
    query: exp.Select,
    own: str,
    bodies: dict[str, exp.Expr],
    names: set[str],
    columns: tuple[str, ...],
    compiled: Compiled,
) -> Compiled:
    """``query`` (reading the CTE ``own``) with the CTEs it needs, in their order."""
    needed = _closure({own}, bodies, names)
    order = [name for name in bodies if name in needed]
    query.set("with_", exp.With(expressions=[_cte(name, bodies[name]) for name in order]))
    return Compiled(query, columns, (), compiled.dialect)


def split_at_choice(compiled: Compiled | None, prefix: str) -> Split | None:
    """``compiled`` split at the nodes :func:`choose` picks, read as views ``<prefix><i>``
    (``None`` for no plan; a plan without nodes is not split)."""
    if compiled is None:
        return None
    if not compiled.nodes:
        return Split((), compiled, compiled)
    chosen = choose(compiled.nodes[-1])
    return split(compiled, chosen, lambda i: f"{prefix}{i}")


def root_split(compiled: Compiled, prefix: str, kept: bool) -> Split | None:
    """A stream table's own plan split like a hidden table's change (:func:`split_at_choice`):
    always when the query keeps hidden tables (the plan is computed in parts anyway), otherwise
    only where a node is chosen (a ``count(DISTINCT)`` over a join and a NOT IN, every table
    changing: 1,363 Spark operators inlined, 97 + 74 split). A stored aggregate's change
    (dvm/state_change.py) carries no nodes and stays one query."""
    found = split_at_choice(compiled, prefix)
    return found if kept or (found is not None and found.first) else None
