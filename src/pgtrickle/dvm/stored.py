"""A stream table that keeps the state of the aggregate at its root (the algebraic rule).

Pure: no I/O. When the defining query's tree is an invertible :class:`~pgtrickle.dvm.ir.Aggregate`
(COUNT / SUM / AVG without DISTINCT, FILTER allowed; :func:`pgtrickle.dvm.rules.aggregate.invertible`),
or a projection that only renames such an aggregate's columns, the stream table stores the
aggregate's *state* (:func:`pgtrickle.dvm.rules.aggregate.state_node`) beside its visible columns:

- each visible COUNT and SUM column is its own state column;
- each SUM keeps the count of its non-NULL values in a hidden ``__pgt_n_<column>``;
- each AVG keeps a hidden sum ``__pgt_s_<column>`` and count ``__pgt_n_<column>``; the visible
  AVG column is computed **in PostgreSQL** from them (``sum::numeric / count``, exactly as
  PostgreSQL's own ``avg`` divides), so it agrees with the defining query to the last digit;
- a hidden ``__pgt_count`` counts a group's rows (a group whose count reaches 0 disappears).

A differential refresh then reads the stored state of the touched groups (the stream table
itself, ``Materialized(state, pre=True)``) instead of recomputing them from the sources:
Δ state = −old ⊎ (old + Agg(Δ input)) (:func:`pgtrickle.dvm.rules.delta_state`). The row
identity of such a table is the hash of its group keys (one row per group).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlglot import exp

from pgtrickle.dvm import ir
from pgtrickle.dvm.compile_sql import type_of
from pgtrickle.dvm.compile_types import node_types
from pgtrickle.dvm.rules import aggregate as aggregate_rule
from pgtrickle.errors import UnsupportedQueryError
from pgtrickle.sql.numeric_scale import UNKNOWN, Shape, shape_of_type_name, shape_rule

__all__ = ["StoredAggregate", "stored_aggregate", "stored_rows"]

_HIDDEN_LIMIT = 63
"""PostgreSQL's identifier length."""


@dataclass(frozen=True)
class Average:
    """A visible AVG column and the hidden state columns it is computed from."""

    column: str
    sum_column: str
    count_column: str


@dataclass(frozen=True, eq=False)
class StoredAggregate:
    """How the stream table stores the state of its root aggregate (see the module docstring)."""

    root: ir.Aggregate
    state: ir.Aggregate
    names: tuple[tuple[str, str], ...]
    """(state column, stored column), in the state's column order."""
    keys: tuple[str, ...]
    """The stored group-key columns (the row identity hashes them)."""
    hidden: tuple[str, ...]
    """The hidden stored columns (``__pgt_*``), in the state's order."""
    averages: tuple[Average, ...]
    sums: tuple[tuple[str, str], ...] = ()
    """(stored sum column, stored column counting its non-NULL values): a sum over no value is NULL."""

    @property
    def written(self) -> tuple[str, ...]:
        """The stored columns a plan produces (every state column; the AVG columns are not)."""
        return tuple(stored for _, stored in self.names)

    def stored_of(self, state_column: str) -> str:
        return dict(self.names)[state_column]


def _renames(tree: ir.Node) -> tuple[ir.Aggregate, dict[str, str]] | None:
    """The aggregate under ``tree`` and its column → the tree's column, when ``tree`` is it or
    a projection renaming each of its columns exactly once."""
    if isinstance(tree, ir.Aggregate):
        return tree, {c: c for c in tree.columns}
    if not (isinstance(tree, ir.Project) and isinstance(tree.input, ir.Aggregate)):
        return None
    mapping: dict[str, str] = {}
    for name, expression in tree.outputs:
        if not isinstance(expression, exp.Column) or expression.table:
            return None
        if expression.name in mapping:
            return None
        mapping[expression.name] = name
    if set(mapping) != set(tree.input.columns):
        return None
    return tree.input, mapping


def _hidden_name(prefix: str, column: str, taken: set[str]) -> str:
    base = f"{prefix}{column}"[:_HIDDEN_LIMIT]
    name, i = base, 1
    while name in taken:
        suffix = f"_{i}"
        name = base[: _HIDDEN_LIMIT - len(suffix)] + suffix
        i += 1
    taken.add(name)
    return name


def _not_storable(root: ir.Aggregate, column_types: Mapping[str, Mapping[str, str]]) -> bool:
    """Whether a SUM or AVG cannot be kept as stored state, so the aggregate recomputes its
    touched groups instead (where the quotient is exact or refused, sql/numeric_scale.py):

    - it adds floating-point values: accumulated, they would drift from a recomputation in the
      last bits;
    - an AVG's argument has no display scale known from its type (an unconstrained ``numeric``
      reaches Spark as ``decimal(38,18)``): the hidden sum would carry 18 fraction digits, and
      PostgreSQL's ``sum / count`` rounds to a scale that depends on the sum's display scale
      (``5.0 / 3`` is ``1.6666666666666667``, ``5.000000000000000000 / 3`` has 18 digits).
    """
    types = node_types(root.input, column_types, {})
    for _, call in root.aggregates:
        inner, argument, _, _ = ir.split_aggregate(call)
        if isinstance(inner, (exp.Sum, exp.Avg)) and argument is not None:
            found = type_of(argument, types)
            if found is None or any(word in found for word in ("double", "real", "float")):
                return True
            if isinstance(inner, exp.Avg) and _display_scale(argument, types) is None:
                return True
    return False


def _display_scale(expression: exp.Expr, types: Mapping[str, str | None]) -> int | None:
    """The display scale of a number expression, the same on every row, or ``None`` when its
    type does not fix it (an unconstrained ``numeric``; sql/numeric_scale.py's rules)."""

    def fold(node: exp.Expr) -> Shape:
        children = {id(c): fold(c) for c in node.iter_expressions()}
        category = type_of(node, types)
        found = shape_rule(node, category, children)
        if found is None and isinstance(node, exp.Column):
            found = shape_of_type_name(types.get(node.name), category)
        return UNKNOWN if found is None else found

    return fold(expression)[1]


def stored_aggregate(
    tree: ir.Node, visible: Sequence[str], column_types: Mapping[str, Mapping[str, str]]
) -> StoredAggregate | None:
    """The stored state of ``tree`` (whose output columns are the stream table's ``visible``
    columns, by position), or ``None`` when its root is not an invertible aggregate (or sums
    floating-point values, or values of a type not known from ``column_types``)."""
    found = _renames(tree)
    if found is None or len(tree.columns) != len(visible):
        return None
    root, renames = found
    try:
        if not aggregate_rule.invertible(root):
            return None
    except UnsupportedQueryError:  # an aggregate split_aggregate does not know (bool_and, ...)
        return None
    if _not_storable(root, column_types):
        return None
    by_position = dict(zip(tree.columns, visible, strict=True))
    shown = {column: by_position[renames[column]] for column in root.columns}
    state = aggregate_rule.state_node(root)
    taken = set(visible)
    names: list[tuple[str, str]] = []
    hidden: list[str] = []
    averages: list[Average] = []
    sums: dict[str, str] = {}
    counts: dict[str, str] = {}
    for column in state.columns:
        if column in shown:
            names.append((column, shown[column]))
            continue
        if column == aggregate_rule.ROW_COUNT:
            stored = _hidden_name("", aggregate_rule.ROW_COUNT, taken)
        elif column.startswith("__pgt_s_"):
            owner = column.removeprefix("__pgt_s_")
            stored = _hidden_name("__pgt_s_", shown[owner], taken)
            sums[owner] = stored
        elif column.startswith("__pgt_n_"):
            owner = column.removeprefix("__pgt_n_")
            stored = _hidden_name("__pgt_n_", shown[owner], taken)
            counts[owner] = stored
        else:  # pragma: no cover - state_node names every column one of the ways above
            raise ValueError(f"unexpected state column {column}")
        names.append((column, stored))
        hidden.append(stored)
    for name, call in root.aggregates:
        if isinstance(ir.split_aggregate(call)[0], exp.Avg):
            averages.append(Average(shown[name], sums[name], counts[name]))
    keys = tuple(shown[k] for k, _ in root.keys)
    stored_of = dict(names)
    sum_pairs = tuple(
        (stored_of[total], stored_of[count]) for total, count in aggregate_rule.sum_counts(root).items()
    )
    return StoredAggregate(root, state, tuple(names), keys, tuple(hidden), tuple(averages), sum_pairs)


def stored_rows(stored: StoredAggregate, state_rows: ir.Node) -> ir.Node:
    """Rows of the state (``state_rows`` has the state's columns) under their stored names."""
    return ir.Project(state_rows, tuple((s, exp.column(c)) for c, s in stored.names))
