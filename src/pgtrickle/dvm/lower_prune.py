"""Column pruning of a lowered tree: each Scan reads, and each Project computes, only what is used.

Pure. The lowering reads every column of a table and keeps every column a
derived table or CTE computes (``EXISTS (SELECT * FROM lineitem ...)`` names all
sixteen). :func:`prune` rebuilds the tree so that every node keeps only the
columns some consumer reads, the root keeping all of its own. What a node
needs from its inputs:

- ``Filter``: what is needed, and the predicate's columns; ``Join``: the same with the
  condition, split by side (a SEMI / ANTI join's right side: only the condition's columns);
- ``Project``: the inputs of the outputs kept; ``Window``: the needed input columns and the
  window functions' inputs (every function is kept);
- ``Aggregate``: its keys' and aggregates' inputs (all kept: the group is the whole key);
- ``Distinct``, ``UnionAll``, ``SetOp``, ``TopK`` (ties are broken by the whole row): every
  input column, since each one changes which rows they return.

A shared node (a CTE read twice) is rebuilt once, keeping what all its consumers need
together, so it stays one object. A node keeps at least one column (a relation of no
columns has no SQL form).
"""

from __future__ import annotations

from sqlglot import exp

from pgtrickle.dvm import ir
from pgtrickle.dvm.ir import (
    Aggregate,
    Distinct,
    Filter,
    Join,
    Node,
    Project,
    Scan,
    SetOp,
    TopK,
    UnionAll,
    Values,
    Window,
)


def _refs(*exprs: exp.Expr | None) -> set[str]:
    return {c.name for e in exprs if e is not None for c in e.find_all(exp.Column)}


def _needs(node: Node, needed: set[str]) -> list[set[str]]:
    """For each input of ``node``, the columns it must keep when ``needed`` of ``node``'s are used."""
    if isinstance(node, Filter):
        return [needed | _refs(node.predicate)]
    if isinstance(node, Join):
        used = needed | _refs(node.condition)
        return [used & set(node.left.columns), used & set(node.right.columns)]
    if isinstance(node, Project):
        return [_refs(*(e for name, e in node.outputs if name in needed))]
    if isinstance(node, Window):
        return [(needed & set(node.input.columns)) | _refs(*(e for _, e in node.functions))]
    if isinstance(node, Aggregate):
        return [_refs(*(e for _, e in node.keys + node.aggregates))]
    return [set(i.columns) for i in node.inputs]


def prune(tree: Node) -> Node:
    """``tree`` with unused columns dropped from Scans and Projects (the root keeps its columns)."""
    order = list(ir.walk(tree))  # children before parents
    needed: dict[int, set[str]] = {id(tree): set(tree.columns)}
    for node in reversed(order):
        mine = needed.setdefault(id(node), set())
        for child, wants in zip(node.inputs, _needs(node, mine), strict=True):
            needed.setdefault(id(child), set()).update(wants)
    built: dict[int, Node] = {}
    for node in order:
        built[id(node)] = _rebuild(node, needed[id(node)], built, node is tree)
    return built[id(tree)]


def _keep(columns: tuple[str, ...], needed: set[str]) -> list[int]:
    kept = [i for i, c in enumerate(columns) if c in needed]
    return kept or [0]


def _rebuild(node: Node, needed: set[str], built: dict[int, Node], root: bool) -> Node:
    new = [built[id(i)] for i in node.inputs]
    if isinstance(node, Scan):
        keep = range(len(node.output)) if root else _keep(node.output, needed)
        return Scan(
            node.relation, tuple(node.source_columns[i] for i in keep), tuple(node.output[i] for i in keep)
        )
    if isinstance(node, Project):
        keep = range(len(node.outputs)) if root else _keep(node.columns, needed)
        return Project(new[0], tuple(node.outputs[i] for i in keep))
    if isinstance(node, Filter):
        return Filter(new[0], node.predicate)
    if isinstance(node, Join):
        return Join(node.kind, new[0], new[1], node.condition)
    if isinstance(node, Aggregate):
        return Aggregate(new[0], node.keys, node.aggregates)
    if isinstance(node, Window):
        return Window(new[0], node.functions)
    if isinstance(node, Distinct):
        return Distinct(new[0])
    if isinstance(node, TopK):
        return TopK(new[0], node.order, node.limit, node.offset)
    if isinstance(node, UnionAll):
        return UnionAll(tuple(new), node.output)
    if isinstance(node, SetOp):
        return SetOp(node.kind, node.all, new[0], new[1], node.output)
    if isinstance(node, Values):
        return node
    raise TypeError(f"prune: unexpected node {type(node).__name__}")
