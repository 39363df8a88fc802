"""Window: a window function's value for a row depends only on the rows of its partition, so
only the partitions the input's change touches can change. The partition key common to all the
node's functions is the set of PARTITION BY expressions they share; ``K`` = its values over the
touched rows::

    Δ Window(X) = −Window(pre X ⋉ K) ⊎ Window(post X ⋉ K)

With no shared PARTITION BY expression the whole input is one partition:
``−Window(pre X) ⊎ Window(post X)``.
"""

from __future__ import annotations

from sqlglot import exp

from pgtrickle.dvm import ir
from pgtrickle.dvm.rules.common import Context, minus, restrict, touched_keys


def common_partition(node: ir.Window) -> list[exp.Expr]:
    """The PARTITION BY expressions every function of ``node`` has (by SQL text, in the first
    function's order)."""
    lists = [list(f.args.get("partition_by") or []) for _, f in node.functions]
    if not lists:
        return []
    shared = set.intersection(*({e.sql() for e in exprs} for exprs in lists))
    out: list[exp.Expr] = []
    for e in lists[0]:
        if e.sql() in shared and all(e.sql() != o.sql() for o in out):
            out.append(e)
    return out


def delta(node: ir.Window, ctx: Context) -> ir.Node | None:
    change = ctx.delta(node.input)
    if change is None:
        return None
    pre, post = ctx.pre(node.input), ctx.post(node.input)
    partition = common_partition(node)
    if partition:
        keys = touched_keys(change, partition, node.input.columns)
        pre, post = restrict(pre, keys, partition), restrict(post, keys, partition)
    return minus(ir.Window(post, node.functions), ir.Window(pre, node.functions), node.columns)
