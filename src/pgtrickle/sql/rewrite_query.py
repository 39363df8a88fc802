"""Query-level rewrites: ``x op ANY/ALL (...)`` into ``IN``/``OR``/``AND`` forms, and
``SELECT DISTINCT ON`` into a ``ROW_NUMBER()`` filter.

Pure: sqlglot tree in, sqlglot tree out.
"""

from __future__ import annotations

from sqlglot import exp

from pgtrickle.sql.nodes import FROM_KEY, QUANTIFIED_PARENTS, array_elements, paren, subquery_operand


def rewrite_quantified(query: exp.Query) -> exp.Query:
    """Rewrite ``x op ANY/ALL (ARRAY[...] | subquery)`` into forms Spark runs."""
    for node in list(query.find_all(exp.Any, exp.All, exp.Anonymous)):
        if isinstance(node, exp.Anonymous):
            if node.name.upper() not in ("ANY", "ALL") or len(node.expressions) != 1:
                continue
            quantifier, operand = node.name.upper(), node.expressions[0]
        else:
            quantifier, operand = ("ANY" if isinstance(node, exp.Any) else "ALL"), node.this
        comparison = node.parent
        if not isinstance(comparison, QUANTIFIED_PARENTS):
            continue
        left = comparison.this
        elements = array_elements(operand)
        replacement: exp.Expr
        if elements is not None:
            if quantifier == "ANY" and isinstance(comparison, exp.EQ):
                replacement = exp.In(this=left, expressions=elements)
            elif quantifier == "ALL" and isinstance(comparison, exp.NEQ):
                replacement = exp.Not(this=paren(exp.In(this=left, expressions=elements)))
            else:
                parts: list[exp.Expr] = [
                    comparison.__class__(this=left.copy(), expression=element) for element in elements
                ]
                replacement = exp.or_(*parts) if quantifier == "ANY" else exp.and_(*parts)
        else:
            subquery = subquery_operand(operand)
            if subquery is None:
                continue
            membership = exp.In(this=left, query=exp.Subquery(this=subquery))
            replacement = membership if quantifier == "ANY" else exp.Not(this=paren(membership))
        comparison.replace(paren(replacement))
    return query


def rewrite_distinct_on(query: exp.Query) -> exp.Query:
    """Replace ``SELECT DISTINCT ON (keys)`` by a ``ROW_NUMBER()`` filter.

    The first row of each key group in the query's ``ORDER BY`` order is
    kept; the ``ORDER BY``, ``LIMIT`` and ``OFFSET`` apply after the filter,
    as in PostgreSQL.
    """
    for select in list(query.find_all(exp.Select)):
        distinct = select.args.get("distinct")
        on = distinct.args.get("on") if isinstance(distinct, exp.Distinct) else None
        if on is None:
            continue
        replacement = _distinct_on_select(select, list(on.expressions))
        if select is query:
            query = replacement
        else:
            select.replace(replacement)
    return query


def _distinct_on_select(select: exp.Select, keys: list[exp.Expr]) -> exp.Select:
    """Build the ``ROW_NUMBER()`` form of one ``SELECT DISTINCT ON``."""
    select.set("distinct", None)
    order = select.args.get("order")
    limit, offset = select.args.get("limit"), select.args.get("offset")
    for arg in ("order", "limit", "offset"):
        select.set(arg, None)
    taken = set(select.named_selects)
    outputs: list[exp.Identifier] = []
    projections: list[exp.Expr] = []
    for projection in select.expressions:
        name = projection.alias_or_name
        quoted = (
            projection.args["alias"].quoted
            if isinstance(projection, exp.Alias) and isinstance(projection.args.get("alias"), exp.Identifier)
            else isinstance(projection, exp.Column) and projection.this.quoted
        )
        if not isinstance(projection, exp.Alias):
            projection = exp.alias_(projection, exp.to_identifier(name, quoted=bool(quoted)))
        projections.append(projection)
        outputs.append(exp.to_identifier(name, quoted=bool(quoted)))
    ordered = list(order.expressions) if isinstance(order, exp.Order) else []
    window_order = [o.copy() for o in ordered] or [
        exp.Ordered(this=key.copy(), nulls_first=False) for key in keys
    ]
    row_number = exp.Window(
        this=exp.RowNumber(),
        partition_by=[key.copy() for key in keys],
        order=exp.Order(expressions=window_order),
    )
    rank_name = _fresh_name(taken, "_pgt_row")
    projections.append(exp.alias_(row_number, rank_name))
    outer_order: list[exp.Expr] = []
    for position, item in enumerate(ordered):
        sort_name = _fresh_name(taken, f"_pgt_sort{position}")
        projections.append(exp.alias_(item.this.copy(), sort_name))
        outer_order.append(
            exp.Ordered(
                this=exp.column(sort_name),
                desc=item.args.get("desc"),
                nulls_first=item.args.get("nulls_first"),
            )
        )
    select.set("expressions", projections)
    outer = exp.Select(expressions=[exp.Column(this=identifier) for identifier in outputs])
    derived = exp.Subquery(this=select, alias=exp.TableAlias(this=exp.to_identifier("_pgt_distinct_on")))
    outer.set(FROM_KEY, exp.From(this=derived))
    outer.set("where", exp.Where(this=exp.EQ(this=exp.column(rank_name), expression=exp.Literal.number(1))))
    if outer_order:
        outer.set("order", exp.Order(expressions=outer_order))
    if limit is not None:
        outer.set("limit", limit)
    if offset is not None:
        outer.set("offset", offset)
    return outer


def _fresh_name(taken: set[str], base: str) -> str:
    """A column name not yet used in ``taken`` (which is updated)."""
    name, counter = base, 1
    while name in taken:
        name, counter = f"{base}_{counter}", counter + 1
    taken.add(name)
    return name
