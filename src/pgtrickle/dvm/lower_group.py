"""Grouping and windows for the lowering: aggregate calls, expressions over groups, window columns.

Pure. An ``Aggregate`` node computes each distinct aggregate call of the
expressions that read it (deduplicated, with its DISTINCT / FILTER / ORDER BY
kept inside the call) grouped by the GROUP BY expressions; those expressions
are then rewritten over the Aggregate's columns: a subexpression equal to a
GROUP BY expression becomes that key's column, an aggregate call its
column. A column left over is neither grouped nor aggregated, which
PostgreSQL allows only through a primary key's functional dependency — the
lowering does not know keys and refuses it. Aggregates inside a window
function's arguments (``sum(count(*)) OVER ()``) are the group's; the window
function itself is not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlglot import exp

from pgtrickle.dvm.ir import Aggregate, Filter, Named, Node, TopK, Window
from pgtrickle.dvm.lower_scope import (
    Names,
    Scope,
    col,
    refuse,
    resolve,
    same,
    unparen,
    walk_skipping_subqueries,
)
from pgtrickle.dvm.lower_subquery import is_placeholder
from pgtrickle.errors import UnsupportedQueryError

_QUERY = (exp.Subquery, exp.Select, exp.SetOperation)


def aggregate(
    names: Names,
    rows: Node,
    scope: Scope,
    keys: Named,
    exprs: Sequence[exp.Expr],
    base_name: Callable[[exp.Expr], str],
) -> tuple[Aggregate, list[exp.Expr]]:
    """``Aggregate(rows)`` for ``exprs`` grouped by ``keys`` (resolved), and ``exprs`` over its columns."""
    resolved = []
    for e in exprs:
        r = resolve(e, scope)
        if r.outer:
            raise refuse("an aggregate or grouped expression read from an enclosing query")
        resolved.append(r.expr)
    calls: list[tuple[str, exp.Expr]] = []
    for e in resolved:
        for call in aggregate_calls(e):
            if not any(same(call, c) for _, c in calls):
                calls.append((names.fresh(base_name(call)), call.copy()))
    node = Aggregate(rows, keys, tuple(calls))
    return node, [_over_groups(e, keys, calls) for e in resolved]


def windows(
    names: Names, node: Node, exprs: list[exp.Expr], base_name: Callable[[exp.Expr], str]
) -> tuple[Node, list[exp.Expr]]:
    """A ``Window`` node computing every window function of ``exprs``, and ``exprs`` over it."""
    functions: list[tuple[str, exp.Expr]] = []

    def take(n: exp.Expr) -> exp.Expr:
        if not isinstance(n, exp.Window):
            return n
        match = next((name for name, f in functions if same(f, n)), None)
        if match is None:
            match = names.fresh(base_name(n.this))
            functions.append((match, n.copy()))
        return col(match)

    out = [e.copy().transform(take, copy=False) for e in exprs]
    return (Window(node, tuple(functions)) if functions else node), out


def _is_aggregate(node: exp.Expr) -> bool:
    if isinstance(node, exp.Filter) and isinstance(node.this, exp.AggFunc):
        return True
    return isinstance(node, exp.AggFunc) and not isinstance(node.parent, (exp.Window, exp.Filter))


def aggregate_calls(node: exp.Expr) -> list[exp.Expr]:
    """Outermost aggregate calls (with their FILTER) outside subqueries; a window's own function
    is not one, but aggregates in its arguments are."""
    found: list[exp.Expr] = []
    for n in walk_skipping_subqueries(node):
        if isinstance(n, (exp.Subquery, exp.Select, exp.SetOperation)):
            continue
        if _is_aggregate(n) and not any(_is_aggregate(a) for a in _ancestors(n, node)):
            found.append(n)
    return found


def _ancestors(node: exp.Expr, top: exp.Expr) -> list[exp.Expr]:
    out = []
    current = node.parent
    while current is not None and current is not top.parent:
        out.append(current)
        current = current.parent
    return out


def _over_groups(expr: exp.Expr, keys: Named, calls: Sequence[tuple[str, exp.Expr]]) -> exp.Expr:
    """``expr`` (resolved) over an Aggregate's columns: key expressions and aggregate calls become
    their columns; a column left over is neither grouped nor aggregated."""

    def swap(n: exp.Expr) -> exp.Expr:
        for name, k in keys:
            if same(n, k):
                return col(name)
        if _is_aggregate(n):
            for name, c in calls:
                if same(n, c):
                    return col(name)
        return n

    out = _transform_outside_subqueries(expr.copy(), swap)
    for c in walk_skipping_subqueries(out):
        if isinstance(c, exp.Column) and not is_placeholder(c) and not c.meta.get("pgt_group"):
            names = {n for n, _ in keys} | {n for n, _ in calls}
            if c.name not in names:
                raise UnsupportedQueryError(
                    f"column {c.name} must appear in the GROUP BY clause or be used in an aggregate function"
                )
    return out


def _transform_outside_subqueries(node: exp.Expr, fn) -> exp.Expr:  # type: ignore[no-untyped-def]
    """Top-down replace, not descending into replaced nodes nor into subqueries."""
    replaced = fn(node)
    if replaced is not node:
        return replaced
    for key, value in list(node.args.items()):
        if isinstance(value, exp.Expr):
            if not isinstance(value, (exp.Subquery, exp.Select, exp.SetOperation)):
                node.set(key, _transform_outside_subqueries(value, fn))
        elif isinstance(value, list):
            node.set(
                key,
                [
                    (
                        _transform_outside_subqueries(v, fn)
                        if isinstance(v, exp.Expr)
                        and not isinstance(v, (exp.Subquery, exp.Select, exp.SetOperation))
                        else v
                    )
                    for v in value
                ],
            )
    return node


def top_k(node: Node, query: exp.Query, keys: list[tuple[str, exp.Ordered]]) -> Node:
    if not keys:
        raise refuse("LIMIT / OFFSET without ORDER BY", "it keeps an arbitrary choice of rows")
    order = tuple(
        exp.Ordered(this=col(name), desc=bool(o.args.get("desc")), nulls_first=o.args.get("nulls_first"))
        for name, o in keys
    )
    return TopK(
        node,
        order,
        count_of(query.args.get("limit"), "LIMIT"),
        count_of(query.args.get("offset"), "OFFSET") or 0,
    )


def distinct_on(
    names: Names, node: Node, on: list[str], order: list[tuple[str, exp.Ordered]], out: Sequence[str]
) -> Node:
    ordered = [
        exp.Ordered(this=col(n), desc=bool(o.args.get("desc")), nulls_first=o.args.get("nulls_first"))
        for n, o in order
    ]
    ordered += [
        exp.Ordered(this=col(n), desc=False, nulls_first=False)
        for n in out
        if n not in {name for name, _ in order}
    ]
    window = exp.Window(
        this=exp.RowNumber(), partition_by=[col(n) for n in on], order=exp.Order(expressions=ordered)
    )
    rank = names.fresh("row_number")
    return Filter(Window(node, ((rank, window),)), exp.EQ(this=col(rank), expression=exp.Literal.number(1)))


def count_of(clause: exp.Expr | None, what: str) -> int | None:
    if clause is None:
        return None
    value = unparen(clause.expression)
    while isinstance(value, exp.Cast):
        value = unparen(value.this)
    if isinstance(value, exp.Null) or (
        isinstance(value, (exp.Column, exp.Var)) and value.name.upper() == "ALL"
    ):
        return None
    if isinstance(value, exp.Literal) and value.is_int and int(value.name) >= 0:
        return int(value.name)
    raise refuse(f"{what} that is not a constant", value.sql("postgres"))


def is_limited(query: exp.Expr) -> bool:
    """Whether LIMIT / OFFSET drop any row (``LIMIT ALL``, ``LIMIT NULL`` and ``OFFSET 0`` do not)."""
    return (
        count_of(query.args.get("limit"), "LIMIT") is not None
        or (count_of(query.args.get("offset"), "OFFSET") or 0) > 0
    )
