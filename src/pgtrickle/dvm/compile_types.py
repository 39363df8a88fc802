"""Facts about IR nodes the compiler needs, each a pure function of the tree.

- :func:`check_node`: the IR's contract for one node (unique, unreserved column names; set
  branches of equal width; sane limits), so a malformed tree fails with a clear error
  instead of producing wrong SQL.
- :func:`node_types`: the PostgreSQL type category of every output column, propagated from
  the source columns' types through every node (unknown stays ``None``).
- :func:`statically_positive`: whether every weight of a node is positive by construction,
  so its rows are already its consolidated positive weights (as a multiset).
"""

from __future__ import annotations

from collections.abc import Mapping

from pgtrickle.dvm.compile_sql import RESERVED_COLUMNS, common_type, type_of, union_type
from pgtrickle.dvm.ir import (
    Aggregate,
    Delta,
    Distinct,
    Filter,
    Join,
    JoinKind,
    Materialized,
    Negate,
    Node,
    Project,
    Scan,
    SetOp,
    TopK,
    UnionAll,
    Values,
    Window,
    walk,
)
from pgtrickle.errors import PgTrickleError

ColumnTypes = Mapping[str, Mapping[str, str]]
"""relation -> source column -> PostgreSQL type name."""


class InvalidPlanError(PgTrickleError, ValueError):
    """An IR tree breaks the IR's contract; the message names the node and the problem."""


def check_node(node: Node) -> None:
    """Raise :class:`InvalidPlanError` where ``node`` breaks the IR's contract (pure)."""
    kind = type(node).__name__
    columns = node.columns
    seen: set[str] = set()
    for name in columns:
        if not isinstance(name, str):
            raise InvalidPlanError(f"{kind}: column names must be strings, got {name!r}")
        if name in RESERVED_COLUMNS:
            raise InvalidPlanError(f"{kind}: column {name!r} is reserved for the compiler's own columns")
        if name in seen:
            raise InvalidPlanError(f"{kind}: column {name!r} appears twice in the output")
        seen.add(name)
    if isinstance(node, Join) and set(node.left.columns) & set(node.right.columns):
        shared = sorted(set(node.left.columns) & set(node.right.columns))
        raise InvalidPlanError(f"Join: both inputs have the columns {shared}; the lowering must rename them")
    if isinstance(node, UnionAll):
        if not node.branches:
            raise InvalidPlanError("UnionAll: no branches")
        widths = {len(b.columns) for b in node.branches}
        if widths != {len(node.output)}:
            raise InvalidPlanError(
                f"UnionAll: branches of widths {sorted(widths)} for {len(node.output)} outputs"
            )
    if isinstance(node, SetOp) and not len(node.left.columns) == len(node.right.columns) == len(node.output):
        raise InvalidPlanError(
            f"SetOp: inputs of widths {len(node.left.columns)} and "
            f"{len(node.right.columns)} for {len(node.output)} outputs"
        )
    if isinstance(node, Values) and any(len(row) != len(node.output) for row in node.rows):
        raise InvalidPlanError(f"Values: a row's width differs from the {len(node.output)} outputs")
    if isinstance(node, TopK):
        if node.limit is not None and (not isinstance(node.limit, int) or node.limit < 0):
            raise InvalidPlanError(f"TopK: limit must be a non-negative integer or None, got {node.limit!r}")
        if not isinstance(node.offset, int) or node.offset < 0:
            raise InvalidPlanError(f"TopK: offset must be a non-negative integer, got {node.offset!r}")
    if (
        isinstance(node, Join)
        and node.condition is None
        and node.kind not in (JoinKind.INNER, JoinKind.SEMI, JoinKind.ANTI)
    ):
        raise InvalidPlanError(f"Join: a {node.kind.value} join needs a condition")


def node_types(
    node: Node, column_types: ColumnTypes, memo: dict[int, dict[str, str | None]]
) -> dict[str, str | None]:
    """Column name -> PostgreSQL type category of ``node``'s output (memoized in ``memo`` by node)."""
    for current in walk(node):
        if id(current) not in memo:
            memo[id(current)] = _types_of(current, column_types, memo)
    return memo[id(node)]


def _types_of(
    node: Node, column_types: ColumnTypes, memo: dict[int, dict[str, str | None]]
) -> dict[str, str | None]:
    def of(child: Node) -> dict[str, str | None]:
        return node_types(child, column_types, memo)

    if isinstance(node, (Scan, Delta)):
        scan = node.scan if isinstance(node, Delta) else node
        known = column_types.get(scan.relation, {})
        return {out: known.get(src) for src, out in zip(scan.source_columns, scan.output, strict=True)}
    if isinstance(node, Materialized):
        return dict(of(node.node))
    if isinstance(node, Values):
        return {
            name: common_type(type_of(row[i], {}) for row in node.rows) if node.rows else None
            for i, name in enumerate(node.output)
        }
    if isinstance(node, (Filter, Negate, Distinct, TopK)):
        return dict(of(node.input))
    if isinstance(node, Project):
        inner = of(node.input)
        return {name: type_of(e, inner) for name, e in node.outputs}
    if isinstance(node, UnionAll):
        branches = [list(of(b).values()) for b in node.branches]
        return {name: union_type(b[i] for b in branches) for i, name in enumerate(node.output)}
    if isinstance(node, SetOp):
        left, right = list(of(node.left).values()), list(of(node.right).values())
        return {name: common_type((left[i], right[i])) for i, name in enumerate(node.output)}
    if isinstance(node, Join):
        if node.kind in (JoinKind.SEMI, JoinKind.ANTI):
            return dict(of(node.left))
        return {**of(node.left), **of(node.right)}
    if isinstance(node, Aggregate):
        inner = of(node.input)
        return {name: type_of(e, inner) for name, e in (*node.keys, *node.aggregates)}
    if isinstance(node, Window):
        inner = of(node.input)
        return {**inner, **{name: type_of(e, inner) for name, e in node.functions}}
    return {name: None for name in node.columns}


def statically_positive(node: Node, memo: dict[int, bool] | None = None) -> bool:
    """Whether every row of ``node`` has a weight > 0 by construction (pure).

    True for table reads, literal rows and every non-linear node's output, and for what
    filters, projections, UNION ALLs, inner joins and SEMI/ANTI joins (by their left input)
    make of such inputs; false for a change (``Delta``) and a negation, and what they flow into.
    """
    memo = {} if memo is None else memo
    for current in walk(node):
        if id(current) in memo:
            continue
        memo[id(current)] = _positive(current, memo)
    return memo[id(node)]


def _positive(node: Node, memo: dict[int, bool]) -> bool:
    if isinstance(node, (Delta, Negate)) or (isinstance(node, Materialized) and node.change):
        return False
    if isinstance(node, (Filter, Project)):
        return memo[id(node.input)]
    if isinstance(node, UnionAll):
        return all(memo[id(b)] for b in node.branches)
    if isinstance(node, Join):
        if node.kind is JoinKind.INNER:
            return memo[id(node.left)] and memo[id(node.right)]
        if node.kind in (JoinKind.SEMI, JoinKind.ANTI):
            return memo[id(node.left)]
        return True
    return True
