"""Rebuilding an operator tree with some of its nodes swapped (pure).

Nodes are frozen and compare by identity (:mod:`pgtrickle.dvm.ir`): a rewrite builds new nodes
along the paths to the swapped ones and keeps every other subtree — and every subtree shared by
two consumers — as the same object, so the rules and the compiler still memoize per node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from pgtrickle.dvm import ir

__all__ = ["replace_nodes", "swap_bottom_up", "transform"]


def replace_nodes(node: ir.Node, replace: Mapping[int, ir.Node]) -> ir.Node:
    """``node``'s tree with every node whose ``id`` is a key of ``replace`` swapped for its value;
    what lies under a ``Delta`` or ``Materialized`` is left alone, and a shared subtree stays one
    object (the same object when nothing under it is swapped)."""
    memo: dict[int, ir.Node] = {}

    def rebuild(current: ir.Node) -> ir.Node:
        key = id(current)
        if key in memo:
            return memo[key]
        if key in replace:
            memo[key] = replace[key]
            return memo[key]
        changes: dict[str, object] = {}
        for f in dataclasses.fields(current):
            value = getattr(current, f.name)
            if isinstance(value, ir.Node) and not isinstance(current, (ir.Delta, ir.Materialized)):
                new = rebuild(value)
                if new is not value:
                    changes[f.name] = new
            elif isinstance(value, tuple) and value and all(isinstance(v, ir.Node) for v in value):
                items = tuple(rebuild(v) for v in value)
                if any(a is not b for a, b in zip(items, value, strict=True)):
                    changes[f.name] = items
        memo[key] = dataclasses.replace(current, **changes) if changes else current
        return memo[key]

    return rebuild(node)


def transform(node: ir.Node, fn: Callable[[ir.Node], ir.Node]) -> ir.Node:
    """``node``'s tree rebuilt bottom up, each node (its inputs already transformed) replaced by
    ``fn(node)``; what lies under a ``Delta`` or ``Materialized`` is left alone, and a shared
    subtree stays one object."""
    return _bottom_up(node, lambda _, rebuilt: fn(rebuilt))


def swap_bottom_up(node: ir.Node, swap: Mapping[int, Callable[[ir.Node], ir.Node]]) -> ir.Node:
    """``node``'s tree rebuilt bottom up, each node whose ``id`` is a key of ``swap`` replaced by
    ``swap[id](n)``, ``n`` being that node with its inputs already rebuilt — so a swapped node
    under another swapped node is swapped in what replaces the outer one too (which
    :func:`replace_nodes`, given replacements made beforehand, cannot do)."""
    return _bottom_up(
        node, lambda original, rebuilt: swap[id(original)](rebuilt) if id(original) in swap else rebuilt
    )


def _bottom_up(node: ir.Node, fn: Callable[[ir.Node, ir.Node], ir.Node]) -> ir.Node:
    """``node``'s tree rebuilt bottom up: each node becomes ``fn(original, rebuilt)``."""
    memo: dict[int, ir.Node] = {}

    def rebuild(current: ir.Node) -> ir.Node:
        key = id(current)
        if key not in memo:
            swapped: dict[int, ir.Node] = {}
            if not isinstance(current, (ir.Delta, ir.Materialized)):
                for child in current.inputs:
                    new = rebuild(child)
                    if new is not child:
                        swapped[id(child)] = new
            rebuilt = replace_nodes(current, swapped) if swapped else current
            memo[key] = fn(current, rebuilt)
        return memo[key]

    return rebuild(node)
