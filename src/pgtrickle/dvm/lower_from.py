"""Lowering of a FROM clause: table reads, CTE references, derived tables, joins; WHERE pushdown.

Pure. Semantics:

- A FROM clause is a list of comma-separated *groups*; a group is one item followed by its
  explicit joins (``a JOIN b ON ...``), which bind tighter than commas, as in SQL. Groups (and
  ``CROSS JOIN``) are combined by inner joins; their order is free, so :func:`combine` takes
  them greedily in the order that lets each next group join the ones before it through a WHERE
  conjunct (``FROM part, supplier, partsupp`` joins part to partsupp first, not part × supplier).
- WHERE conjuncts without subqueries are pushed down (:func:`push_filters`): through inner
  joins to the side whose columns they read, or into the join condition when they read both;
  through the preserved side of an outer join; never into the padded side (that would change
  which rows are padded) and never into a shared node (a CTE read twice stays one object).
- ``USING (k)`` / ``NATURAL``: the condition is ``l.k = r.k``; unqualified ``k`` then denotes the
  left column (the right one for RIGHT JOIN, ``COALESCE(l.k, r.k)`` for FULL JOIN, computed by
  a Project above the join), and ``*`` shows ``k`` once, first.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from pgtrickle.dvm.ir import Join, JoinKind, Node, Project, Values
from pgtrickle.dvm.lower_api import LowererApi
from pgtrickle.dvm.lower_scope import Binding, Scope, col, column_names, conjoin, refuse, resolve
from pgtrickle.errors import UnsupportedQueryError
from pgtrickle.sql.translate import set_returning_function

_SIDES = {"LEFT": JoinKind.LEFT, "RIGHT": JoinKind.RIGHT, "FULL": JoinKind.FULL}


def from_groups(lw: LowererApi, select: exp.Select, scope: Scope) -> list[Node]:
    """Lower the FROM clause's groups; their bindings are added to ``scope``."""
    from_ = select.args.get("from_") or select.args.get("from")
    if from_ is None:
        return []
    groups: list[tuple[exp.Expr, list[exp.Join]]] = [(from_.this, [])]
    for join in select.args.get("joins") or []:
        kind = (join.args.get("kind") or "").upper()
        explicit = (
            join.args.get("on") is not None
            or join.args.get("using")
            or join.args.get("side")
            or join.args.get("method")
            or kind in ("INNER", "OUTER")
        )
        if explicit:
            groups[-1][1].append(join)
        else:
            groups.append((join.this, []))
    return [_group(lw, item, joins, scope) for item, joins in groups]


def _group(lw: LowererApi, item: exp.Expr, joins: Sequence[exp.Join], scope: Scope) -> Node:
    node = _item(lw, item, scope)
    for join in joins:
        node = _join(lw, node, join, scope)
    return node


def _item(lw: LowererApi, item: exp.Expr, scope: Scope) -> Node:
    """One FROM item: a table or CTE, a derived table, a parenthesized join, VALUES."""
    if isinstance(item, exp.Lateral) or item.args.get("lateral"):
        raise refuse("LATERAL", "a FROM item that reads columns of the items before it")
    if isinstance(item, exp.Table):
        if not isinstance(item.this, exp.Identifier):
            name = set_returning_function(item.this) if isinstance(item.this, exp.Expr) else None
            raise refuse(f"the set-returning function {name}() in FROM" if name else "a function in FROM")
        if item.args.get("joins"):
            inner = item.copy()
            inner.set("joins", None)
            return _group(lw, inner, item.args["joins"], scope)
        return _table(lw, item, scope)
    if isinstance(item, exp.Subquery):
        body = item.this
        if isinstance(body, (exp.Table, exp.Subquery)) and not item.alias:
            return _item(lw, body, scope)
        if not item.alias:
            raise UnsupportedQueryError("a subquery in FROM must have an alias")
        node, names = lw.query(body, scope.outer, scope.ctes)
        return _bind(scope, item.alias, _alias_columns(item, names), node)
    if isinstance(item, exp.Values):
        return _values(lw, item, scope)
    raise refuse(f"the FROM item {item.sql('postgres')[:60]}")


def _alias_columns(item: exp.Expr, names: Sequence[str]) -> list[str]:
    alias = item.args.get("alias")
    given = [c.name for c in (alias.columns if alias is not None else [])]
    if len(given) > len(names):
        raise UnsupportedQueryError(
            f"{item.alias_or_name} has {len(names)} columns available but {len(given)} columns specified"
        )
    return given + list(names[len(given) :])


def _bind(scope: Scope, alias: str, visible: Sequence[str], node: Node) -> Node:
    if scope.binding(alias) is not None:
        raise UnsupportedQueryError(f"table name {alias!r} specified more than once")
    binding = Binding(alias, dict(zip(visible, node.columns, strict=True)))
    scope.bindings.append(binding)
    scope.star_order.extend((alias, v, u) for v, u in binding.columns.items())
    return node


def _table(lw: LowererApi, table: exp.Table, scope: Scope) -> Node:
    if table.args.get("only"):
        raise refuse("FROM ONLY")
    if table.args.get("sample"):
        raise refuse("TABLESAMPLE")
    schema, name = table.text("db"), table.name
    alias = table.alias or name
    if not schema and name in scope.ctes:
        node, names = lw.cte(name, scope.ctes)
        return _bind(scope, alias, _alias_columns(table, names), node)
    node, names = lw.scan(schema, name)
    return _bind(scope, alias, _alias_columns(table, names), node)


def _values(lw: LowererApi, values: exp.Values, scope: Scope) -> Node:
    rows = [tuple(r.expressions) if isinstance(r, exp.Tuple) else (r,) for r in values.expressions]
    width = len(rows[0])
    if any(len(r) != width for r in rows):
        raise UnsupportedQueryError("VALUES lists must all be the same length")
    for row in rows:
        for value in row:
            if value.find(exp.Column, exp.Subquery, exp.Select):
                raise refuse("a VALUES list reading columns or subqueries")
    names = [f"column{i + 1}" for i in range(width)]
    node = Values(tuple(tuple(v.copy() for v in r) for r in rows), tuple(lw.names.fresh(n) for n in names))
    return _bind(scope, values.alias or "*VALUES*", _alias_columns(values, names), node)


def _join(lw: LowererApi, left: Node, join: exp.Join, scope: Scope) -> Node:
    side = (join.args.get("side") or "").upper()
    kind = (join.args.get("kind") or "").upper()
    if kind in ("SEMI", "ANTI", "ASOF") or join.args.get("lateral"):
        raise refuse(f"{kind or 'LATERAL'} JOIN")
    jkind = _SIDES.get(side, JoinKind.INNER)
    left_star = list(scope.star_order)
    right = _item(lw, join.this, scope)
    using = [u.name for u in join.args.get("using") or []]
    if (join.args.get("method") or "").upper() == "NATURAL":
        left_names = {v for _, v, _ in left_star}
        using = [v for _, v, _ in scope.star_order[len(left_star) :] if v in left_names]
    if using:
        return _using(lw, left, right, jkind, using, left_star, scope)
    on = join.args.get("on")
    if on is None:
        if jkind is not JoinKind.INNER:
            raise UnsupportedQueryError(f"{side} JOIN needs an ON or USING clause")
        return Join(JoinKind.INNER, left, right, None)
    resolved = resolve(on, scope)
    if resolved.outer:
        raise refuse("a join condition correlated with an enclosing query")
    if lw.has_subquery(on):
        raise refuse("a subquery in a JOIN ... ON condition")
    return Join(jkind, left, right, resolved.expr)


def _using(
    lw: LowererApi,
    left: Node,
    right: Node,
    kind: JoinKind,
    using: list[str],
    left_star: list[tuple[str | None, str, str]],
    scope: Scope,
) -> Node:
    right_star = scope.star_order[len(left_star) :]

    def pick(star: list[tuple[str | None, str, str]], name: str, side: str) -> str:
        found = [u for _, v, u in star if v == name]
        if len(found) != 1:
            raise UnsupportedQueryError(
                f"column {name!r} specified in USING clause "
                f"{'does not exist' if not found else 'is ambiguous'} in the {side} table"
            )
        return found[0]

    pairs = [(pick(left_star, n, "left"), pick(right_star, n, "right")) for n in using]
    condition = conjoin([exp.EQ(this=col(lu), expression=col(ru)) for lu, ru in pairs])
    node: Node = Join(kind, left, right, condition)
    merged: dict[str, str] = {}
    if kind is JoinKind.FULL:
        extra = [
            (lw.names.fresh(n), exp.func("COALESCE", col(lu), col(ru)))
            for n, (lu, ru) in zip(using, pairs, strict=True)
        ]
        node = Project(node, tuple((c, col(c)) for c in node.columns) + tuple(extra))
        merged = {n: name for n, (name, _) in zip(using, extra, strict=True)}
    else:
        merged = {n: (ru if kind is JoinKind.RIGHT else lu) for n, (lu, ru) in zip(using, pairs, strict=True)}
    scope.merged.update(merged)
    hidden = {u for pair in pairs for u in pair}
    scope.star_order[:] = (
        [(None, n, merged[n]) for n in using]
        + [s for s in left_star if s[2] not in hidden]
        + [s for s in right_star if s[2] not in hidden]
    )
    return node


def combine(groups: Sequence[Node], predicates: Sequence[exp.Expr]) -> Node:
    """Inner-join the FROM groups, each next one chosen to connect to the ones before it."""
    if not groups:
        raise UnsupportedQueryError("a SELECT without FROM has nothing to join")
    remaining = list(groups)
    node = remaining.pop(0)
    while remaining:
        have = set(node.columns)
        pick = 0
        for i, candidate in enumerate(remaining):
            theirs = set(candidate.columns)
            if any(
                (cols := column_names(p)) & have and cols & theirs and cols <= have | theirs
                for p in predicates
            ):
                pick = i
                break
        node = Join(JoinKind.INNER, node, remaining.pop(pick), None)
    return node


def push_filters(node: Node, predicates: Sequence[exp.Expr], shared: set[int]) -> Node:
    """``node`` filtered by every predicate, each placed as low in the join tree as it can go."""
    from pgtrickle.dvm.ir import Filter

    if not predicates:
        return node
    if (
        isinstance(node, Join)
        and id(node) not in shared
        and node.kind in (JoinKind.INNER, JoinKind.LEFT, JoinKind.RIGHT)
    ):
        left_cols, right_cols = set(node.left.columns), set(node.right.columns)
        to_left, to_right, here = [], [], []
        for p in predicates:
            cols = column_names(p)
            if cols <= left_cols and node.kind in (JoinKind.INNER, JoinKind.LEFT) and cols:
                to_left.append(p)
            elif cols <= right_cols and node.kind in (JoinKind.INNER, JoinKind.RIGHT) and cols:
                to_right.append(p)
            else:
                here.append(p)
        left = push_filters(node.left, to_left, shared)
        right = push_filters(node.right, to_right, shared)
        if node.kind is JoinKind.INNER:
            terms = ([node.condition] if node.condition is not None else []) + here
            return Join(node.kind, left, right, conjoin(terms))
        rebuilt = Join(node.kind, left, right, node.condition)
        return Filter(rebuilt, conjoin(here) or exp.true()) if here else rebuilt
    if isinstance(node, Filter) and id(node) not in shared:
        return Filter(node.input, conjoin([node.predicate, *predicates]) or node.predicate)
    return Filter(node, conjoin(list(predicates)) or exp.true())
