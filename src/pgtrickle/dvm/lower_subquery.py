"""Decorrelation: subqueries in WHERE, HAVING and the select list become joins.

Pure. Each rule keeps SQL's three-valued logic exactly where the result is
used as a WHERE (or HAVING) conjunct, the only place a rule applies; a
subquery test anywhere else (under OR, in the select list) is refused.

- ``EXISTS (q)`` -> ``SEMI`` join of the current rows with ``q``'s FROM/WHERE; the WHERE
  conjuncts of ``q`` that read the outer query (the correlation) become the join condition.
  ``NOT EXISTS`` -> ``ANTI``.
- ``x IN (q)`` / ``x = ANY (q)`` -> ``SEMI`` on ``x = y`` (and the correlation).
  ``x NOT IN (q)`` / ``x <> ALL (q)`` -> ``ANTI`` on ``(x = y) IS NOT FALSE``: a row is kept only
  when no ``y`` equals it *or is unknown*, which is NOT IN's NULL rule.
  ``x op ANY (q)`` -> ``SEMI`` on ``x op y``; ``x op ALL (q)`` -> ``ANTI`` on ``(x op y) IS NOT TRUE``.
  A grouped, DISTINCT or set-operation ``q`` is lowered whole (it must then be uncorrelated).
- A scalar subquery ``(q)``: uncorrelated, an aggregate without GROUP BY is exactly one row, so
  it is an inner cross join with that row; any other ``q`` is a LEFT JOIN ON TRUE (no row: NULL).
  Correlated, ``q`` must be one aggregate expression whose correlation is equalities
  ``inner = outer`` (and conditions on the outer row alone): it becomes a LEFT JOIN to ``q``'s
  aggregate grouped by the inner sides, on the outer sides (and those conditions). A row
  with no group reads ``q``'s value over no rows — COUNT is 0 there, not NULL (the COUNT
  bug) — through ``CASE WHEN <group matched> IS NULL THEN <value over no
  rows> ELSE <value> END``, where the value over no rows is the expression with COUNT(...) as 0
  and every other aggregate as NULL.
- Correlation reaching two query levels out, or outside the WHERE clause of the subquery, is
  refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from pgtrickle.dvm.ir import Aggregate, Join, JoinKind, Node, Project
from pgtrickle.dvm.lower_api import LowererApi
from pgtrickle.dvm.lower_from import combine, from_groups, push_filters
from pgtrickle.dvm.lower_scope import (
    PLACEHOLDER,
    Scope,
    col,
    column_names,
    conjoin,
    conjuncts,
    is_subquery,
    refuse,
    resolve,
    subquery_body,
    unparen,
    walk_skipping_subqueries,
)
from pgtrickle.errors import UnsupportedQueryError

_FLIP = {exp.EQ: exp.EQ, exp.NEQ: exp.NEQ, exp.LT: exp.LT, exp.LTE: exp.LTE, exp.GT: exp.GT, exp.GTE: exp.GTE}


@dataclass
class Body:
    """A subquery's FROM/WHERE as a node, its select list over it, and its lifted correlation."""

    node: Node
    exprs: list[exp.Expr]
    lifted: list[exp.Expr]


def where(lw: LowererApi, select: exp.Select, scope: Scope, lift: bool) -> tuple[Node | None, list[exp.Expr]]:
    """Lower FROM and WHERE of ``select``: the node, and the conjuncts lifted out (correlation)."""
    groups = from_groups(lw, select, scope)
    clause = select.args.get("where")
    terms = conjuncts(clause.this if clause is not None else None)
    plain, lifted, tests = [], [], []
    for term in terms:
        if lw.has_subquery(term):
            tests.append(term)
            continue
        resolved = resolve(term, scope)
        if resolved.outer:
            if not lift or resolved.outer_depth > 1:
                raise refuse(
                    "a subquery correlated with a query two levels out"
                    if lift
                    else "a correlated subquery of this form",
                    "correlation must sit in the WHERE clause of an EXISTS / IN subquery or of a "
                    "scalar subquery computing one aggregate; derived tables and CTEs cannot read "
                    "an enclosing query",
                )
            lifted.append(resolved.expr)
        else:
            plain.append(resolved.expr)
    if not groups:
        if plain or tests:
            groups = [lw.one_row()]
        else:
            return None, lifted
    node = push_filters(combine(groups, plain), plain, lw.shared)
    for term in tests:
        node = _test(lw, node, term, scope)
    return node, lifted


def _test(lw: LowererApi, node: Node, term: exp.Expr, scope: Scope) -> Node:
    """One WHERE conjunct holding a subquery."""
    inner = unparen(term)
    negated = isinstance(inner, exp.Not)
    if negated:
        inner = unparen(inner.this)
    if isinstance(inner, exp.Exists):
        body = _body(lw, inner.this, scope)
        condition = conjoin(body.lifted) or exp.true()
        return Join(JoinKind.ANTI if negated else JoinKind.SEMI, node, body.node, condition)
    if isinstance(inner, exp.In) and inner.args.get("query") is not None:
        left = _operands(inner.this, scope)
        body = _body(lw, inner.args["query"], scope)
        eq = _equalities(left, body.exprs)
        if negated:
            return Join(JoinKind.ANTI, node, body.node, conjoin([*body.lifted, _is_not(eq, False)]))
        return Join(JoinKind.SEMI, node, body.node, conjoin([*body.lifted, eq]))
    if type(inner) in _FLIP and isinstance(inner.expression, (exp.Any, exp.All)) and not negated:
        quantifier = inner.expression
        left = _operands(inner.this, scope)
        body = _body(lw, quantifier.this, scope)
        if len(left) != 1 or len(body.exprs) != 1:
            raise refuse("a row comparison with ANY / ALL (subquery)")
        compare = type(inner)(this=left[0], expression=body.exprs[0])
        if isinstance(quantifier, exp.Any):
            return Join(JoinKind.SEMI, node, body.node, conjoin([*body.lifted, compare]))
        if isinstance(inner, exp.NEQ):
            test = _is_not(exp.EQ(this=left[0].copy(), expression=body.exprs[0].copy()), False)
        else:
            test = _is_not(compare, True)
        return Join(JoinKind.ANTI, node, body.node, conjoin([*body.lifted, test]))
    node, expr = scalars(lw, node, term, scope)
    resolved = resolve(expr, scope)
    if resolved.outer:
        raise refuse("a condition on a scalar subquery that also reads an enclosing query")
    return push_filters(node, [resolved.expr], lw.shared)


def _test_name(node: exp.Expr) -> str:
    if isinstance(node, exp.In):
        return "IN / NOT IN"
    return type(node).__name__.upper()


def _is_not(test: exp.Expr, value: bool) -> exp.Expr:
    return exp.Not(this=exp.Is(this=exp.Paren(this=test), expression=exp.true() if value else exp.false()))


def _operands(node: exp.Expr, scope: Scope) -> list[exp.Expr]:
    items = list(node.expressions) if isinstance(unparen(node), exp.Tuple) else [node]
    resolved = [resolve(unparen(i), scope) for i in items]
    if any(r.outer for r in resolved):
        raise refuse("an IN / ANY / ALL operand read from an enclosing query")
    return [r.expr for r in resolved]


def _equalities(left: list[exp.Expr], right: list[exp.Expr]) -> exp.Expr:
    if len(left) != len(right):
        raise UnsupportedQueryError(
            f"subquery has {'too many' if len(right) > len(left) else 'too few'} columns for IN"
        )
    return (
        conjoin([exp.EQ(this=lv, expression=rv.copy()) for lv, rv in zip(left, right, strict=True)])
        or exp.true()
    )


def _simple(select: exp.Query) -> bool:
    """A SELECT whose FROM/WHERE rows are all a semi-join needs (no grouping, limit, window)."""
    if not isinstance(select, exp.Select):
        return False
    if any(select.args.get(a) for a in ("group", "having", "limit", "offset", "windows", "with_")):
        return False
    return not any(n.find(exp.AggFunc, exp.Window) for n in select.expressions)


def _body(lw: LowererApi, operand: exp.Expr, scope: Scope) -> Body:
    """The rows of a subquery used by a semi- or anti-join, with its correlation lifted out."""
    query = subquery_body(operand)
    if not _simple(query):
        node, _ = lw.query(query, scope, scope.ctes)
        return Body(node, [col(c) for c in node.columns], [])
    assert isinstance(query, exp.Select)
    inner = Scope(outer=scope, ctes=scope.ctes)
    rows, lifted = where(lw, query, inner, lift=True)
    exprs: list[exp.Expr] = []
    for item in query.expressions:
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
            exprs.extend(col(u) for _, u in inner.star(item.table if isinstance(item, exp.Column) else None))
            continue
        value = item.this if isinstance(item, exp.Alias) else item
        if lw.has_subquery(value):
            raise refuse("a subquery in the select list of an EXISTS / IN subquery")
        resolved = resolve(value, inner)
        if resolved.outer:
            raise refuse("a select list of an IN subquery that reads the enclosing query")
        exprs.append(resolved.expr)
    return Body(rows if rows is not None else lw.one_row(), exprs, lifted)


def scalars(
    lw: LowererApi, node: Node, expr: exp.Expr, scope: Scope, grouped: bool = False
) -> tuple[Node, exp.Expr]:
    """Join ``node`` with every scalar subquery of ``expr``; ``expr`` with each replaced by its value.

    The value expressions are marked resolved (they already name the tree's unique columns).
    """
    for n in walk_skipping_subqueries(expr):
        if isinstance(n, (exp.Exists, exp.Any, exp.All)) or (isinstance(n, exp.In) and n.args.get("query")):
            raise refuse(
                f"{_test_name(n)} (subquery) that is not a WHERE conjunct of its own",
                "only `AND`-ed EXISTS / IN / NOT IN / ANY / ALL tests become semi- and anti-joins",
            )
    expr = expr.copy()
    found = [n for n in walk_skipping_subqueries(expr) if isinstance(n, exp.Subquery) and n is not expr]
    if isinstance(expr, exp.Subquery):
        found.insert(0, expr)
    for sub in found:
        node, value = _scalar(lw, node, sub, scope, grouped)
        for c in value.find_all(exp.Column):
            c.meta[PLACEHOLDER] = True
        if sub is expr:
            expr = value
        else:
            sub.replace(value)
    return node, expr


def _scalar(
    lw: LowererApi, node: Node, sub: exp.Subquery, scope: Scope, grouped: bool
) -> tuple[Node, exp.Expr]:
    query = subquery_body(sub)
    aggregate = isinstance(query, exp.Select) and len(query.expressions) == 1 and _simple_aggregate(query)
    if not aggregate:
        found, names = lw.query(query, scope, scope.ctes)
        if len(names) != 1:
            raise UnsupportedQueryError("subquery must return only one column")
        return Join(JoinKind.LEFT, node, found, exp.true()), col(found.columns[0])
    assert isinstance(query, exp.Select)
    inner = Scope(outer=scope, ctes=scope.ctes)
    rows, lifted = where(lw, query, inner, lift=True)
    if rows is None:
        rows = lw.one_row()
    if lifted and grouped:
        raise refuse("a correlated scalar subquery in a grouped query's select list or HAVING")
    mine = set(rows.columns)
    keys: list[tuple[exp.Expr, exp.Expr]] = []
    outer_only: list[exp.Expr] = []
    for term in lifted:
        if not column_names(term) & mine:
            outer_only.append(term)  # decides for the whole outer row: a join condition
            continue
        pair = _correlation_pair(term, mine)
        if pair is None:
            raise refuse(
                "a correlated scalar subquery whose correlation is not `inner = outer`", term.sql("postgres")
            )
        keys.append(pair)
    item = query.expressions[0]
    value = item.this if isinstance(item, exp.Alias) else item
    if holds_subquery(value):
        raise refuse("a subquery inside a scalar subquery's aggregate expression")
    key_names = tuple((lw.names.fresh("corr_key"), inner_expr) for inner_expr, _ in keys)
    agg, post = lw.aggregate(rows, inner, key_names, [value])
    result = lw.names.fresh(lw.base_name(value))
    if not keys and not outer_only:
        return Join(JoinKind.INNER, node, Project(agg, ((result, post[0]),)), None), col(result)
    present = lw.names.fresh("matched")
    outputs = (*((k, col(k)) for k, _ in key_names), (result, post[0]), (present, exp.true()))
    right = Project(agg, outputs)
    condition = conjoin(
        [
            exp.EQ(this=outer_expr, expression=col(k))
            for (_, outer_expr), (k, _) in zip(keys, key_names, strict=True)
        ]
        + outer_only
    )
    joined = Join(JoinKind.LEFT, node, right, condition)
    empty = _over_no_rows(post[0], agg)
    if isinstance(empty, exp.Null):
        return joined, col(result)
    case = exp.Case(
        ifs=[exp.If(this=exp.Is(this=col(present), expression=exp.Null()), true=empty)], default=col(result)
    )
    return joined, case


def _simple_aggregate(select: exp.Select) -> bool:
    if any(
        select.args.get(a) for a in ("group", "having", "limit", "offset", "windows", "distinct", "with_")
    ):
        return False
    item = select.expressions[0]
    return bool(item.find(exp.AggFunc)) and not item.find(exp.Window)


def _correlation_pair(term: exp.Expr, inner: set[str]) -> tuple[exp.Expr, exp.Expr] | None:
    """``(inner side, outer side)`` of a correlation ``inner = outer`` (either way round)."""
    term = unparen(term)
    if not isinstance(term, exp.EQ):
        return None
    a, b = term.this, term.expression
    a_cols, b_cols = column_names(a), column_names(b)
    if a_cols and a_cols <= inner and not (b_cols & inner):
        return a, b
    if b_cols and b_cols <= inner and not (a_cols & inner):
        return b, a
    return None


def _over_no_rows(post: exp.Expr, agg: Aggregate) -> exp.Expr:
    """The aggregate expression's value over no input rows: COUNT is 0, other aggregates NULL."""
    values = {
        name: (exp.Literal.number(0) if isinstance(_call(call), exp.Count) else exp.Null())
        for name, call in agg.aggregates
    }
    replaced = post.copy().transform(
        lambda n: values[n.name].copy() if isinstance(n, exp.Column) and n.name in values else n, copy=False
    )
    if isinstance(unparen(replaced), exp.Null):
        return exp.Null()
    strict = (exp.Binary, exp.Paren, exp.Neg, exp.Cast, exp.Null, exp.Literal)
    counts = any(
        isinstance(values[c.name], exp.Literal) for c in post.find_all(exp.Column) if c.name in values
    )
    if not counts and all(
        isinstance(n, strict) and not isinstance(n, exp.Connector) for n in replaced.walk()
    ):
        return exp.Null()
    return replaced


def _call(node: exp.Expr) -> exp.Expr:
    return node.this if isinstance(node, exp.Filter) else node


def is_placeholder(node: exp.Expr) -> bool:
    return isinstance(node, exp.Column) and bool(node.meta.get(PLACEHOLDER))


def holds_subquery(node: exp.Expr) -> bool:
    return any(is_subquery(n) for n in walk_skipping_subqueries(node) if n is not node) or is_subquery(node)
