"""Lower a parsed defining query (sqlglot) into the operator IR of the delta engine.

Pure: no I/O. The input is what :func:`pgtrickle.sql.translate.parse_query`
returns for PostgreSQL's normalized query text (``pg_get_viewdef``), and the
columns of every relation it reads; the output is a tree of
:mod:`pgtrickle.dvm.ir` nodes that denotes the same multiset of rows.

What becomes what
-----------------
- A table is a ``Scan`` of all its columns; a FROM-less SELECT of constants a ``Values`` row.
- Comma / CROSS / INNER / LEFT / RIGHT / FULL joins, USING and NATURAL, parenthesized joins
  and derived tables: :mod:`pgtrickle.dvm.lower_from` (inner joins ordered to follow the WHERE
  clause's join conditions, WHERE conjuncts pushed down).
- ``WITH`` at any level (the top, a subquery, another CTE): a CTE is lowered once, when first
  read, and every read of it is that one node object (a second read in one join is a renaming
  ``Project`` over it, so the join's inputs keep disjoint names). ``WITH RECURSIVE`` is refused.
- Subqueries in WHERE / HAVING / the select list: :mod:`pgtrickle.dvm.lower_subquery`.
- GROUP BY (expressions, positions) and aggregates without GROUP BY: ``Aggregate`` over the
  rows; every aggregate call (with its DISTINCT, FILTER, ORDER BY) is one aggregate column and
  every GROUP BY expression one key column, deduplicated; expressions over them (``sum(x) / 7``,
  a key expression in the select list) are a ``Project`` above; HAVING is a ``Filter`` above.
  GROUPING SETS / ROLLUP / CUBE are refused.
- Window functions: a ``Window`` node adding one column per call (after grouping, so
  ``sum(count(*)) OVER ()`` works); a named ``WINDOW`` clause is refused.
- SELECT DISTINCT: ``Distinct``. DISTINCT ON: ``ROW_NUMBER() OVER (PARTITION BY <on> ORDER BY
  <order>, <every output column>)`` kept where it is 1 — the ORDER BY picks the row as in
  PostgreSQL, and the output columns break the ties PostgreSQL leaves unspecified, so the
  result is a function of the input.
- UNION ALL: ``UnionAll`` (nested chains flattened); UNION: ``Distinct(UnionAll)``;
  INTERSECT / EXCEPT [ALL]: ``SetOp``. Outputs are named after the first branch.
- ORDER BY with LIMIT / OFFSET: ``TopK`` (sort keys not in the output are carried as extra
  columns and dropped by a Project above). ORDER BY without LIMIT is dropped: a table has no
  order. LIMIT without ORDER BY (an arbitrary choice of rows) is refused.

Names: every node's columns are unique in the whole tree (``lower_scope.Names``: the source
name, else ``name_1``...), except the root's, which are the query's output names in order.
Constructs with no rule raise :class:`pgtrickle.errors.NoDeltaRuleError` naming the construct;
a name that does not resolve raises :class:`pgtrickle.errors.UnsupportedQueryError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlglot import exp

from pgtrickle.dvm.ir import (
    Aggregate,
    Distinct,
    Filter,
    Named,
    Node,
    Project,
    Scan,
    SetOp,
    SetOpKind,
    UnionAll,
    Values,
)
from pgtrickle.dvm.lower_check import check
from pgtrickle.dvm.lower_group import aggregate, aggregate_calls, distinct_on, is_limited, top_k, windows
from pgtrickle.dvm.lower_prune import prune
from pgtrickle.dvm.lower_scope import Names, Scope, col, output_name, refuse, resolve, same, unparen
from pgtrickle.dvm.lower_subquery import holds_subquery, scalars, where
from pgtrickle.errors import UnsupportedQueryError

__all__ = ["lower"]


def lower(query: exp.Query, schema: Mapping[str, Sequence[str]]) -> Node:
    """The IR tree of ``query``; ``schema`` maps ``"schema.table"`` to the table's columns in order.

    Raises:
        NoDeltaRuleError: the query uses a construct the delta engine has no rule for.
        UnsupportedQueryError: a relation or column does not resolve, or the query is malformed.
    """
    check(query)
    node, _ = Lowerer(schema).query(query, None, {}, root=True)
    return prune(node)


@dataclass
class _Cte:
    definition: exp.CTE
    visible: Mapping[str, object]
    """The CTEs its body can read (the ones defined before it, and the enclosing queries')."""


class Lowerer:
    """One lowering: the name allocator, the schema, and the CTE nodes already built."""

    def __init__(self, schema: Mapping[str, Sequence[str]]) -> None:
        self.schema = {key: tuple(cols) for key, cols in schema.items()}
        self.names = Names()
        self.shared: set[int] = set()
        self._cte_nodes: dict[int, tuple[Node, list[str]]] = {}

    # ------------------------------------------------------------------ leaves
    def scan(self, schema: str, table: str) -> tuple[Node, list[str]]:
        key = f"{schema or 'pg_catalog'}.{table}"
        if key not in self.schema:
            raise UnsupportedQueryError(f"relation {key} is not in the schema given to the lowering")
        columns = self.schema[key]
        return Scan(key, columns, tuple(self.names.fresh(c) for c in columns)), list(columns)

    def one_row(self) -> Values:
        return Values(((exp.true(),),), (self.names.fresh("one_row"),))

    def cte(self, name: str, ctes: Mapping[str, object]) -> tuple[Node, list[str]]:
        """The node of CTE ``name``: built on first read; later reads see the same node, renamed."""
        entry = ctes[name]
        assert isinstance(entry, _Cte)
        key = id(entry.definition)
        if key not in self._cte_nodes:
            node, names = self.query(entry.definition.this, None, entry.visible)
            alias = entry.definition.args.get("alias")
            given = [c.name for c in (alias.columns if alias is not None else [])]
            if len(given) > len(names):
                raise UnsupportedQueryError(
                    f"WITH query {name!r} has {len(names)} columns available "
                    f"but {len(given)} columns specified"
                )
            self._cte_nodes[key] = (node, given + names[len(given) :])
            self.shared.add(id(node))
            return self._cte_nodes[key]
        node, names = self._cte_nodes[key]
        renamed = Project(node, tuple((self.names.fresh(c), col(c)) for c in node.columns))
        return renamed, names

    # ------------------------------------------------------------------ queries
    def query(
        self, query: exp.Expr, outer: Scope | None, ctes: Mapping[str, object], root: bool = False
    ) -> tuple[Node, list[str]]:
        """Lower a SELECT or set operation; returns the node and its visible output names."""
        while isinstance(query, exp.Subquery) and not query.alias:
            query = query.this
        with_ = query.args.get("with_") or query.args.get("with")
        if with_ is not None:
            visible = dict(ctes)
            for definition in with_.expressions:
                visible[definition.alias] = _Cte(definition, dict(visible))
            ctes = visible
        if isinstance(query, exp.Select):
            return self._select(query, outer, ctes, root)
        if isinstance(query, (exp.Union, exp.Intersect, exp.Except)):
            return self._set_operation(query, outer, ctes, root)
        raise refuse(f"the query form {type(query).__name__}")

    def _outputs(self, names: Sequence[str], root: bool) -> tuple[str, ...]:
        if root:
            duplicate = next((n for i, n in enumerate(names) if n in names[:i]), None)
            if duplicate is not None:
                raise UnsupportedQueryError(f"column {duplicate!r} appears twice in the query's output")
            return tuple(names)
        return tuple(self.names.fresh(n) for n in names)

    def _set_operation(
        self, query: exp.SetOperation, outer: Scope | None, ctes: Mapping[str, object], root: bool
    ) -> tuple[Node, list[str]]:
        distinct = bool(query.args.get("distinct"))
        if isinstance(query, exp.Union):
            branches = _union_branches(query.this, distinct) + _union_branches(query.expression, distinct)
            parts = [self.query(b, outer, ctes) for b in branches]
        else:
            parts = [self.query(query.this, outer, ctes), self.query(query.expression, outer, ctes)]
        names = parts[0][1]
        if any(len(p[1]) != len(names) for p in parts):
            raise UnsupportedQueryError(
                f"each {type(query).__name__.upper()} query must have the same number of columns"
            )
        limited = is_limited(query)
        out = self._outputs(names, root)
        node: Node
        if isinstance(query, exp.Union):
            node = UnionAll(tuple(p[0] for p in parts), out)
            node = Distinct(node) if distinct else node
        else:
            kind = SetOpKind.INTERSECT if isinstance(query, exp.Intersect) else SetOpKind.EXCEPT
            node = SetOp(kind, not distinct, parts[0][0], parts[1][0], out)
        if limited:
            keys = (
                [self._output_key(o.this, names, out) for o in query.args["order"].expressions]
                if query.args.get("order")
                else []
            )
            node = top_k(
                node,
                query,
                [(k, o) for k, o in zip(keys, query.args["order"].expressions, strict=True)] if keys else [],
            )
        return node, list(names)

    def _output_key(self, key: exp.Expr, names: Sequence[str], columns: Sequence[str]) -> str:
        key = unparen(key)
        if isinstance(key, exp.Literal) and key.is_int and 1 <= int(key.name) <= len(columns):
            return columns[int(key.name) - 1]
        if isinstance(key, exp.Column) and not key.table and key.name in names:
            return columns[list(names).index(key.name)]
        raise refuse("an ORDER BY key of a set operation that is not an output column", key.sql("postgres"))

    def _select(
        self, select: exp.Select, outer: Scope | None, ctes: Mapping[str, object], root: bool
    ) -> tuple[Node, list[str]]:
        scope = Scope(outer=outer, ctes=ctes)
        node, _lifted = where(self, select, scope, lift=False)
        items = self._items(select, scope)
        names = [n for n, _ in items]
        grouped = bool(select.args.get("group") or select.args.get("having")) or any(
            aggregate_calls(e) for _, e in items
        )
        if node is None:
            if not grouped and not any(holds_subquery(e) or e.find(exp.Window) for _, e in items):
                rows = (tuple(self._resolve_local(e, scope) for _, e in items),)
                return Values(rows, self._outputs(names, root)), names
            node = self.one_row()
        order = list(select.args["order"].expressions) if select.args.get("order") else []
        limited = is_limited(select)
        distinct = select.args.get("distinct")
        on = list(distinct.args["on"].expressions) if distinct is not None and distinct.args.get("on") else []
        keep_order = limited or bool(on)
        exprs = [e for _, e in items]
        extra = [self._order_expr(o.this, items, select) for o in order] if keep_order else []
        extra += [self._order_expr(k, items, select) for k in on]
        wanted = exprs + [e for e in extra if not isinstance(e, int)]
        if grouped:
            keys = self._group_keys(select, items, scope)
            node, done = self.aggregate(node, scope, keys, [*wanted, *_having(select)])
            having = done[len(wanted) :]
            done = done[: len(wanted)]
            node, done = self._attach_all(node, done, scope, grouped=True)
            if having:
                node, (cond,) = self._attach_all(node, having, scope, grouped=True)
                node = Filter(node, cond)
        else:
            node, done = self._attach_all(node, wanted, scope, grouped=False)
            done = [self._resolve_local(e, scope) for e in done]
        node, done = self._windows(node, done)
        values, hidden = done[: len(exprs)], done[len(exprs) :]
        key_columns: list[int | exp.Expr] = []
        it = iter(hidden)
        for e in extra:
            key_columns.append(e if isinstance(e, int) else next(it))
        return self._finish(node, select, names, values, key_columns, order if keep_order else [], on, root)

    def _finish(
        self,
        node: Node,
        select: exp.Select,
        names: list[str],
        values: list[exp.Expr],
        keys: list[int | exp.Expr],
        order: list[exp.Ordered],
        on: list[exp.Expr],
        root: bool,
    ) -> tuple[Node, list[str]]:
        """Project, then DISTINCT / DISTINCT ON / TopK, dropping sort-only columns at the end."""
        hidden_exprs: list[exp.Expr] = []
        positions: list[int] = []
        for k in keys:
            if isinstance(k, int):
                positions.append(k)
                continue
            match = next((i for i, v in enumerate(values) if same(v, k)), None)
            if match is None:
                hidden_exprs.append(k)
                match = len(values) + len(hidden_exprs) - 1
            positions.append(match)
        needs_final = bool(hidden_exprs) or bool(on)
        out = self._outputs(names, root and not needs_final)
        hidden = tuple(self.names.fresh("sort_key") for _ in hidden_exprs)
        node = Project(
            node, tuple(zip(out, values, strict=True)) + tuple(zip(hidden, hidden_exprs, strict=True))
        )
        columns = node.columns
        order_keys = [(columns[p], o) for p, o in zip(positions[: len(order)], order, strict=True)]
        if on:
            node = distinct_on(
                self.names, node, [columns[p] for p in positions[len(order) :]], order_keys, out
            )
        elif select.args.get("distinct"):
            node = Distinct(node)
        if is_limited(select):
            node = top_k(node, select, order_keys)
        if needs_final:
            node = Project(node, tuple(zip(self._outputs(names, root), [col(c) for c in out], strict=True)))
        return node, names

    # ------------------------------------------------------------------ select list
    @staticmethod
    def _resolve_local(expr: exp.Expr, scope: Scope) -> exp.Expr:
        resolved = resolve(expr, scope)
        if resolved.outer:
            raise refuse(
                "a correlated subquery of this form",
                "only the WHERE clause of an EXISTS / IN subquery or of a scalar subquery computing "
                "one aggregate may read the enclosing query",
            )
        return resolved.expr

    def _items(self, select: exp.Select, scope: Scope) -> list[tuple[str, exp.Expr]]:
        items: list[tuple[str, exp.Expr]] = []
        for i, item in enumerate(select.expressions):
            if isinstance(item, exp.Star) or (
                isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
            ):
                for visible, unique in scope.star(
                    item.table or None if isinstance(item, exp.Column) else None
                ):
                    ref = col(unique)
                    ref.meta["pgt_resolved"] = True
                    items.append((visible, ref))
                continue
            items.append((output_name(item, i), (item.this if isinstance(item, exp.Alias) else item).copy()))
        return items

    def _order_expr(
        self, key: exp.Expr, items: list[tuple[str, exp.Expr]], select: exp.Select
    ) -> int | exp.Expr:
        """An ORDER BY / DISTINCT ON key: a select-list position, or an expression to compute."""
        inner = unparen(key)
        if isinstance(inner, exp.Literal) and inner.is_int:
            position = int(inner.name)
            if not 1 <= position <= len(items):
                raise UnsupportedQueryError(f"ORDER BY position {position} is not in select list")
            return position - 1
        if isinstance(inner, exp.Column) and not inner.table:
            matches = [i for i, (n, _) in enumerate(items) if n == inner.name]
            if len(matches) == 1:
                return matches[0]
        return key.copy()

    def _group_keys(self, select: exp.Select, items: list[tuple[str, exp.Expr]], scope: Scope) -> Named:
        group = select.args.get("group")
        keys: list[tuple[str, exp.Expr]] = []
        for g in group.expressions if group is not None else []:
            chosen = self._order_expr(g, items, select) if isinstance(unparen(g), exp.Literal) else g
            expr = items[chosen][1] if isinstance(chosen, int) else chosen
            if holds_subquery(expr):
                raise refuse("a subquery in GROUP BY")
            resolved = resolve(expr, scope)
            if resolved.outer:
                raise refuse("a GROUP BY expression read from an enclosing query")
            if not any(same(resolved.expr, k) for _, k in keys):
                keys.append((self.names.fresh(self.base_name(resolved.expr)), resolved.expr))
        return tuple(keys)

    # ------------------------------------------------------------------ grouping
    def aggregate(
        self, rows: Node, scope: Scope, keys: Named, exprs: Sequence[exp.Expr]
    ) -> tuple[Aggregate, list[exp.Expr]]:
        """``Aggregate(rows)`` computing every aggregate call of ``exprs`` grouped by ``keys``; and
        ``exprs`` rewritten over its columns (subqueries inside them are left as they are)."""
        return aggregate(self.names, rows, scope, keys, exprs, self.base_name)

    def _attach_all(
        self, node: Node, exprs: Sequence[exp.Expr], scope: Scope, grouped: bool
    ) -> tuple[Node, list[exp.Expr]]:
        done = []
        for e in exprs:
            if holds_subquery(e):
                node, e = scalars(self, node, e, scope, grouped)
            done.append(e)
        return node, done

    def _windows(self, node: Node, exprs: list[exp.Expr]) -> tuple[Node, list[exp.Expr]]:
        return windows(self.names, node, exprs, self.base_name)

    @staticmethod
    def base_name(expr: exp.Expr) -> str:
        expr = unparen(expr)
        if isinstance(expr, exp.Filter):
            expr = expr.this
        if isinstance(expr, exp.Column):
            return expr.name
        return output_name(expr, 0) if isinstance(expr, exp.Func) else "expr"

    @staticmethod
    def has_subquery(node: exp.Expr) -> bool:
        return holds_subquery(node)


def _union_branches(query: exp.Expr, distinct: bool) -> list[exp.Expr]:
    """The branches of a UNION chain: UNION ALL flattens UNION ALL; UNION flattens both."""
    while isinstance(query, exp.Subquery) and not query.alias:
        query = query.this
    if (
        isinstance(query, exp.Union)
        and not any(query.args.get(a) for a in ("order", "limit", "offset", "with_"))
        and (distinct or not query.args.get("distinct"))
    ):
        return _union_branches(query.this, distinct) + _union_branches(query.expression, distinct)
    return [query]


def _having(select: exp.Select) -> list[exp.Expr]:
    having = select.args.get("having")
    return [having.this.copy()] if having is not None else []
