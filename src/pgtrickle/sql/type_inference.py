"""Infer the PostgreSQL type category of every expression of a query (see ``sql/typing_rules.py``).

Pure.  Column types come from the caller (``column_types``) and are resolved
through aliases, derived tables, CTEs and set operations; the categories are
stored on the nodes for the rewriter (``sql/rewrite_expressions.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.scope import Scope, traverse_scope

from pgtrickle.sql import blank_padded
from pgtrickle.sql.functions import TIMESTAMP_FUNCTIONS
from pgtrickle.sql.nodes import META_KEY, fold_outputs
from pgtrickle.sql.numeric_scale import SHAPE_KEY, UNKNOWN, Shape, shape_of_type_name, shape_rule
from pgtrickle.sql.parse import cte_names
from pgtrickle.sql.typing_rules import (
    FIXED_RESULT_TYPES,
    FLOAT_TYPES,
    INT_TYPES,
    SAME_AS_ARGUMENT,
    arithmetic_type,
    category_from_datatype,
    category_from_name,
    common_type,
    first_argument,
    number_literal_type,
)


class TypeInference:
    """Infer PostgreSQL type categories of a query's expressions.

    The category of every node is stored in ``node.meta["pgt_type"]``
    (``None`` when unknown) for the rewriter to read.
    """

    def __init__(self, query: exp.Expr, column_types: Mapping[tuple[str, str], Mapping[str, str]]) -> None:
        self._query = query
        self._columns: dict[tuple[str, str], dict[str, str | None]] = {
            (schema, table): {name: category_from_name(type_name) for name, type_name in columns.items()}
            for (schema, table), columns in column_types.items()
        }
        self._widths: dict[tuple[str, str], dict[str, int | None]] = {
            key: {name: blank_padded.width_from_type_name(type_name) for name, type_name in columns.items()}
            for key, columns in column_types.items()
        }
        self._type_names: dict[tuple[str, str], dict[str, str]] = {
            key: dict(columns) for key, columns in column_types.items()
        }
        self._shapes: dict[int, Shape] = {}
        self._ctes = cte_names(query)
        self._scope_of: dict[int, Scope] = {}
        try:
            scopes = traverse_scope(query)
        except (SqlglotError, KeyError, AttributeError, ValueError):
            scopes = []
        for scope in scopes:
            for column in scope.columns:
                self._scope_of.setdefault(id(column), scope)
        self._memo: dict[int, str | None] = {}
        self._busy: set[int] = set()

    def annotate(self) -> None:
        """Store the inferred category on every node of the query."""
        for node in list(self._query.walk()):
            node.meta[META_KEY] = self.type_of(node)
            if node.meta[META_KEY] in ("numeric", *INT_TYPES):
                node.meta[SHAPE_KEY] = self.shape_of(node)
            width = self.padded_width(node)
            if width is not None:
                node.meta[blank_padded.WIDTH_KEY] = width

    def padded_width(self, node: exp.Expr | None, depth: int = 0) -> int | None:
        """``n`` when ``node`` is a ``character(n)`` value, ``0`` for ``bpchar`` without a length, else None."""
        while isinstance(node, exp.Paren):
            node = node.this
        if node is None or depth > 32:
            return None
        if isinstance(node, exp.Cast):
            return blank_padded.width_from_datatype(node.to)
        if isinstance(node, (exp.Coalesce, exp.Min, exp.Max)):
            widths = [
                self.padded_width(arg, depth + 1)
                for arg in [node.this, *node.expressions]
                if not isinstance(arg, exp.Null)
            ]
            return _same_width(widths) if widths else None
        if not isinstance(node, exp.Column):
            return None
        found = self._column_source(node)
        if found is None:
            return None
        source, name = found
        if isinstance(source, Scope):
            names = _scope_output_names(source)
            if names is None or name not in names:
                return None
            return self._query_width(source.expression, names.index(name), depth + 1)
        return self._widths.get(self._table_key(source), {}).get(name)

    def shape_of(self, node: exp.Expr | None, depth: int = 0) -> Shape:
        """The integer digits and display scale of a numeric expression (``sql/numeric_scale.py``)."""
        if node is None or depth > 64:
            return UNKNOWN
        key = id(node)
        if key in self._shapes:
            return self._shapes[key]
        children = {id(c): self.shape_of(c, depth + 1) for c in node.iter_expressions()}
        found = shape_rule(node, self.type_of(node), children)
        if found is None:
            found = self._column_shape(node, depth) if isinstance(node, exp.Column) else UNKNOWN
            if isinstance(node, exp.Subquery):
                found = self._query_shape(node, 0, depth + 1)
        self._shapes[key] = found
        return found

    def _column_shape(self, column: exp.Column, depth: int) -> Shape:
        """The shape of a column from its source table's type name or its derived table's query."""
        found = self._column_source(column)
        if found is None:
            return shape_of_type_name(None, self.type_of(column))
        source, name = found
        if isinstance(source, Scope):
            names = _scope_output_names(source)
            if names is None or name not in names:
                return UNKNOWN
            return self._query_shape(source.expression, names.index(name), depth + 1)
        type_name = self._type_names.get(self._table_key(source), {}).get(name)
        return shape_of_type_name(type_name, self.type_of(column))

    def _query_shape(self, node: exp.Expr, index: int, depth: int) -> Shape:
        """The shape of the ``index``-th output column of a (sub)query: of every branch."""

        def leaf(projection: exp.Expr | None) -> Shape:
            return UNKNOWN if projection is None else self.shape_of(projection, depth)

        def combine(shapes: list[Shape]) -> Shape:
            digits = [d for d, _ in shapes]
            scales = {s for _, s in shapes}
            return (
                None if None in digits else max(d for d in digits if d is not None),
                scales.pop() if len(scales) == 1 else None,
            )

        return fold_outputs(node, index, leaf, combine)

    def _query_width(self, node: exp.Expr, index: int, depth: int) -> int | None:
        """Width of the ``index``-th output column of a (sub)query (see :meth:`padded_width`)."""

        def leaf(projection: exp.Expr | None) -> int | None:
            if projection is None:
                return None
            return self.padded_width(
                projection.this if isinstance(projection, exp.Alias) else projection, depth
            )

        return fold_outputs(node, index, leaf, _same_width, through_values=False)

    def type_of(self, node: exp.Expr | None) -> str | None:
        """Return the inferred category of ``node`` (memoised)."""
        if node is None:
            return None
        key = id(node)
        if key in self._memo:
            return self._memo[key]
        if key in self._busy:
            return None
        self._busy.add(key)
        try:
            result = self._compute(node)
        finally:
            self._busy.discard(key)
        self._memo[key] = result
        return result

    def _compute(self, node: exp.Expr) -> str | None:
        """Compute a node's category."""
        if isinstance(node, exp.Literal):
            return "text" if node.is_string else number_literal_type(node.this)
        if isinstance(node, exp.Null):
            return "null"
        if isinstance(node, exp.Cast):
            return category_from_datatype(node.to)
        if isinstance(node, exp.Column):
            return self._column_type(node)
        if isinstance(node, SAME_AS_ARGUMENT):
            return self.type_of(first_argument(node))
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod)):
            return arithmetic_type(node, self.type_of(node.this), self.type_of(node.expression))
        if isinstance(node, exp.IntDiv):
            return "int8"
        for cls, category in FIXED_RESULT_TYPES.items():
            if isinstance(node, cls):
                return category
        if isinstance(node, exp.Case):
            branches = [branch.args.get("true") for branch in node.args.get("ifs") or []]
            default = node.args.get("default")
            return common_type(self.type_of(b) for b in [*branches, default] if b is not None)
        if isinstance(node, exp.If):
            return common_type(
                self.type_of(b) for b in (node.args.get("true"), node.args.get("false")) if b is not None
            )
        if isinstance(node, (exp.Coalesce, exp.Greatest, exp.Least)):
            return common_type(self.type_of(arg) for arg in [node.this, *node.expressions])
        if isinstance(node, exp.Sum):
            inner = self.type_of(first_argument(node))
            return {"int2": "int8", "int4": "int8", "int8": "numeric"}.get(inner or "", inner)
        if isinstance(node, exp.Avg):
            inner = self.type_of(first_argument(node))
            if inner in (*INT_TYPES, "numeric"):
                return "numeric"
            return "float8" if inner in FLOAT_TYPES else inner
        if isinstance(node, (exp.Stddev, exp.StddevSamp, exp.StddevPop, exp.Variance, exp.VariancePop)):
            return "numeric" if self.type_of(first_argument(node)) in (*INT_TYPES, "numeric") else "float8"
        if isinstance(node, (exp.Log, exp.Pow)):
            return self.type_of(node.expression if node.expression is not None else node.this)
        if isinstance(node, (exp.TimestampTrunc, exp.DateTrunc)):
            inner = self.type_of(node.this)
            return "timestamptz" if inner == "date" else inner
        if isinstance(node, exp.WithinGroup):
            if isinstance(node.this, exp.PercentileCont):
                return "float8"
            ordered = node.find(exp.Ordered)
            return self.type_of(ordered.this) if ordered is not None else None
        if isinstance(node, (exp.Subquery, exp.Select, exp.SetOperation)):
            return self._query_type(node, 0)
        if isinstance(node, exp.Anonymous):
            name = node.name.lower()
            if name == "make_date":
                return "date"
            if name in TIMESTAMP_FUNCTIONS:
                return "timestamptz"
            if name == "every":
                return "bool"
            if name == "octet_length":
                return "int4"
        return None

    def _query_type(self, node: exp.Expr, index: int) -> str | None:
        """Category of the ``index``-th output column of a (sub)query."""
        return fold_outputs(node, index, self.type_of, common_type)

    def _column_type(self, column: exp.Column) -> str | None:
        """Resolve a column reference to its source and return that column's category."""
        found = self._column_source(column)
        return None if found is None else self._source_column_type(*found)

    def _column_source(self, column: exp.Column) -> tuple[exp.Table | Scope, str] | None:
        """The FROM source (a table, or a derived table's scope) a column reference reads, and its name."""
        scope = self._scope_of.get(id(column))
        name = column.name
        table = column.table
        while scope is not None:
            if table:
                source = scope.sources.get(table)
                if source is not None:
                    return source, name
            else:
                sources = [source for _node, source in scope.selected_sources.values()]
                knowledge = [self._source_has_column(source, name) for source in sources]
                matches = [source for source, has in zip(sources, knowledge, strict=True) if has]
                if len(matches) == 1:
                    return matches[0], name
                if matches or any(has is None for has in knowledge):
                    return None
            scope = scope.parent
        return None

    def _table_key(self, table: exp.Table) -> tuple[str, str]:
        """The ``(schema, table)`` key of a base-table reference."""
        return (table.text("db") or "pg_catalog", table.name)

    def _source_has_column(self, source: exp.Table | Scope, name: str) -> bool | None:
        """Whether a FROM source has a column (None when that is not known)."""
        if isinstance(source, Scope):
            names = _scope_output_names(source)
            return None if names is None else name in names
        columns = self._columns.get(self._table_key(source))
        return None if columns is None else name in columns

    def _source_column_type(self, source: exp.Table | Scope, name: str) -> str | None:
        """Category of a column of a FROM source."""
        if isinstance(source, Scope):
            names = _scope_output_names(source)
            if names is None or name not in names:
                return None
            return self._query_type(source.expression, names.index(name))
        columns = self._columns.get(self._table_key(source))
        return None if columns is None else columns.get(name)


def _same_width(widths: list[int | None]) -> int | None:
    """The width of values from several branches (set operations, ``coalesce``...): theirs when they
    agree, 0 (``bpchar`` of no length) when they differ, None when one is not blank-padded."""
    distinct = set(widths)
    return distinct.pop() if len(distinct) == 1 else (0 if None not in distinct else None)


def _scope_output_names(scope: Scope) -> list[str] | None:
    """Output column names of a derived table, CTE or VALUES list."""
    node = scope.expression
    alias: exp.Expr | None = None
    if isinstance(node, exp.Values):
        alias = node.args.get("alias")
    elif isinstance(node.parent, (exp.Subquery, exp.CTE)):
        alias = node.parent.args.get("alias")
    if isinstance(alias, exp.TableAlias) and alias.columns:
        return [column.name for column in alias.columns]
    while isinstance(node, exp.SetOperation):
        node = node.this
    while isinstance(node, exp.Subquery):
        node = node.this
    if isinstance(node, exp.Select):
        return list(node.named_selects)
    return None
