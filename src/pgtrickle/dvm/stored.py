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
- a hidden ``__pgt_count`` counts a group's rows (a group whose count reaches 0 disappears);
- a visible column that is an *arithmetic expression* of the aggregate's columns (``sum(a) /
  sum(b)``, ``100.00 * sum(x) / count(*)``: columns, numeric constants, ``+ - * /``, unary minus
  and casts to a number type; :class:`Derived`) is computed **in PostgreSQL** from the stored
  state too, like an AVG, so it is PostgreSQL's own value; the aggregate columns it reads that
  are not visible themselves are kept in hidden ``__pgt_v_<column>``. A SUM it reads must have
  the display scale a recomputation would give, since a quotient's digits depend on it: the
  argument's scale is fixed by its type, or it is a CASE choosing between such values and the
  constant 0 (a sum of zeros only is 0 whatever its scale).

A differential refresh then reads the stored state of the touched groups (the stream table
itself, ``Materialized(state, pre=True)``) instead of recomputing them from the sources:
Δ state = −old ⊎ (old + Agg(Δ input)) (:func:`pgtrickle.dvm.rules.delta_state`). The row
identity of such a table is the hash of its group keys (one row per group).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sqlglot import exp

from pgtrickle.dvm import ir
from pgtrickle.dvm.compile_sql import type_of
from pgtrickle.dvm.compile_types import node_types
from pgtrickle.dvm.rules import aggregate as aggregate_rule
from pgtrickle.errors import UnsupportedQueryError
from pgtrickle.sql.nodes import literal_decimal
from pgtrickle.sql.numeric_scale import UNKNOWN, Shape, shape_of_type_name, shape_rule

__all__ = ["Derived", "StoredAggregate", "average_of", "not_storable", "stored_aggregate", "stored_rows"]

_HIDDEN_LIMIT = 63
"""PostgreSQL's identifier length."""


@dataclass(frozen=True)
class Average:
    """A visible AVG column and the hidden state columns it is computed from."""

    column: str
    sum_column: str
    count_column: str


@dataclass(frozen=True)
class Derived:
    """A visible column computed in PostgreSQL from the stored state: ``expression`` (PostgreSQL
    semantics, as in the IR) over the root aggregate's columns."""

    column: str
    expression: exp.Expr


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
    derived: tuple[Derived, ...] = ()
    scales: tuple[tuple[str, int], ...] = ()
    """(aggregate column, PostgreSQL's display scale of its sum) of each SUM and AVG a derived
    column reads: it reads the sum rounded to that scale (the same value)."""

    @property
    def written(self) -> tuple[str, ...]:
        """The stored columns a plan produces (every state column; the AVG columns are not)."""
        return tuple(stored for _, stored in self.names)

    def stored_of(self, state_column: str) -> str:
        return dict(self.names)[state_column]

    def derived_sql(self, derived: Derived, value_of: Callable[[str], str]) -> str:
        """PostgreSQL SQL of a derived column, ``value_of(stored column)`` giving the SQL of each
        stored value it reads (``t."total"``, or the merged new value)."""
        stored = dict(self.names)
        scales = dict(self.scales)
        slots: dict[str, str] = {}

        def slot(node: exp.Expr) -> exp.Expr:
            if not isinstance(node, exp.Column):
                return node
            if f"__pgt_s_{node.name}" in stored:  # an AVG, from its hidden sum and count
                total, count = stored[f"__pgt_s_{node.name}"], stored[f"__pgt_n_{node.name}"]
                value = average_of(
                    f"round({value_of(total)}, {scales[node.name]})", value_of(count), "numeric"
                )
            elif node.name in scales:
                value = f"round({value_of(stored[node.name])}, {scales[node.name]})"
            else:
                value = value_of(stored[node.name])
            name = f"__PGT_SLOT_{len(slots)}__"
            slots[name] = f"({value})"
            return exp.var(name)

        text = derived.expression.copy().transform(slot).sql(dialect="postgres")
        for name, value in slots.items():
            text = text.replace(name, value)
        return f"({text})"


def average_of(total: str, count: str, pg_type: str) -> str:
    """PostgreSQL's ``avg`` from SQL expressions of its sum and count: ``sum / count`` in the AVG's
    own type (``numeric`` for integers and numerics, ``double precision`` for floats), NULL
    without values."""
    cast = "double precision" if pg_type in ("double precision", "real") else "numeric"
    return f"CASE WHEN ({count}) > 0 THEN (({total})::{cast} / ({count})::{cast}) END"


_DERIVABLE = (
    *(exp.Column, exp.Identifier, exp.Literal, exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Neg, exp.Paren),
    *(exp.Cast, exp.DataType, exp.DataTypeParam),
)
"""What a column computed from the stored state may hold (an arithmetic expression)."""
_NUMBER_TYPES = (exp.DType.DECIMAL, exp.DType.INT, exp.DType.BIGINT, exp.DType.SMALLINT)


def _derivable(expression: exp.Expr, columns: set[str]) -> bool:
    for node in expression.walk():
        if not isinstance(node, _DERIVABLE):
            return False
        if isinstance(node, exp.Column) and (node.table or node.name not in columns):
            return False
        if isinstance(node, exp.Literal) and node.is_string:
            return False
        if isinstance(node, exp.Cast) and not node.to.is_type(*_NUMBER_TYPES):
            return False
    return any(isinstance(n, exp.Column) for n in expression.walk())


def _shape(tree: ir.Node) -> tuple[ir.Aggregate, dict[str, str], tuple[Derived, ...]] | None:
    """The aggregate under ``tree``, its columns shown as they are (column → the tree's column)
    and the tree's columns derived from them, when ``tree`` is the aggregate or a projection of
    its columns (each group key shown as it is) and arithmetic expressions of them."""
    if isinstance(tree, ir.Aggregate):
        return tree, {c: c for c in tree.columns}, ()
    if not (isinstance(tree, ir.Project) and isinstance(tree.input, ir.Aggregate)):
        return None
    root = tree.input
    columns = set(root.columns)
    mapping: dict[str, str] = {}
    derived: list[Derived] = []
    for name, expression in tree.outputs:
        if isinstance(expression, exp.Column) and not expression.table and expression.name not in mapping:
            if expression.name not in columns:
                return None
            mapping[expression.name] = name
        elif _derivable(expression, columns):
            derived.append(Derived(name, expression))
        else:
            return None
    if any(key not in mapping for key, _ in root.keys):
        return None
    return root, mapping, tuple(derived)


def _hidden_name(prefix: str, column: str, taken: set[str]) -> str:
    base = f"{prefix}{column}"[:_HIDDEN_LIMIT]
    name, i = base, 1
    while name in taken:
        suffix = f"_{i}"
        name = base[: _HIDDEN_LIMIT - len(suffix)] + suffix
        i += 1
    taken.add(name)
    return name


def not_storable(root: ir.Aggregate, column_types: Mapping[str, Mapping[str, str]]) -> bool:
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
            if (
                isinstance(inner, exp.Avg)
                and _display_scale(*_defined(argument, root.input, column_types)) is None
            ):
                return True
    return False


def _derived_scales(
    root: ir.Aggregate, column_types: Mapping[str, Mapping[str, str]], derived: Sequence[Derived]
) -> dict[str, int] | None:
    """The display scale PostgreSQL gives each SUM and AVG sum a derived column reads, or
    ``None`` when one is not known (:func:`_kept_scale`). A quotient's digits depend on its
    operands' display scales, and the hidden sums carry Spark's decimal scale (``0::numeric``
    is ``decimal(38,18)`` there), so a derived column reads each sum rounded to its own scale:
    the same value, PostgreSQL's scale."""
    types = node_types(root.input, column_types, {})
    read = {c.name for d in derived for c in d.expression.find_all(exp.Column)}
    scales: dict[str, int] = {}
    for name, call in root.aggregates:
        inner, argument, _, _ = ir.split_aggregate(call)
        if name in read and isinstance(inner, (exp.Sum, exp.Avg)) and argument is not None:
            if isinstance(inner, exp.Sum) and type_of(argument, types) in ("int2", "int4"):
                continue  # a bigint: no scale (and rounding would make it a numeric)
            scale = _kept_scale(*_defined(argument, root.input, column_types))
            if scale is None:
                return None
            scales[name] = scale
    return scales


def _defined(
    argument: exp.Expr, node: ir.Node, column_types: Mapping[str, Mapping[str, str]]
) -> tuple[exp.Expr, dict[str, str | None]]:
    """``argument`` (over ``node``'s columns) with the columns the projections under it compute
    replaced by their expressions, and the types of the columns it then reads: a derived
    table's ``l_extendedprice * (1 - l_discount) AS volume`` has the display scale of its
    expression, which the column's type (``numeric``) does not say."""
    expression = argument.copy()
    while isinstance(node, (ir.Filter, ir.Project)):
        if isinstance(node, ir.Project):
            outputs = dict(node.outputs)

            def inline(n: exp.Expr, outputs: dict[str, exp.Expr] = outputs) -> exp.Expr:
                if isinstance(n, exp.Column) and not n.table and n.name in outputs:
                    return exp.Paren(this=outputs[n.name].copy())
                return n

            expression = expression.transform(inline)
        node = node.input
    return expression, node_types(node, column_types, {})


def _kept_scale(argument: exp.Expr, types: Mapping[str, str | None]) -> int | None:
    """The display scale of a SUM of ``argument`` as PostgreSQL computes it, when a stored sum
    can have it: the argument's scale is the same on every row, or it is a CASE between values
    of one fixed scale and constant zeros of no larger scale (the sums then differ in scale only
    when every summed value is such a zero, and then both are zero)."""
    fixed = _display_scale(argument, types)
    if fixed is not None or not isinstance(argument, exp.Case):
        return fixed
    branches = [b.args.get("true") for b in argument.args.get("ifs") or []]
    branches.append(argument.args.get("default") or exp.null())
    scales: set[int | None] = set()
    zeros: list[int] = [0]
    for branch in branches:
        if isinstance(branch, exp.Null):
            continue
        if _constant_zero(branch):
            zeros.append(_display_scale(branch, types) or 0)
            continue
        scales.add(_display_scale(branch, types))
    if len(scales) != 1:
        return None
    [scale] = scales
    return scale if scale is not None and max(zeros) <= scale else None


def _constant_zero(node: exp.Expr) -> bool:
    """A constant 0, also cast (PostgreSQL's normalized text writes ``0::numeric``)."""
    while isinstance(node, (exp.Cast, exp.Paren)):
        node = node.this
    return literal_decimal(node) == 0


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
    found = _shape(tree)
    if found is None or len(tree.columns) != len(visible):
        return None
    root, renames, derived_columns = found
    try:
        if not aggregate_rule.invertible(root):
            return None
    except UnsupportedQueryError:  # an aggregate split_aggregate does not know (bool_and, ...)
        return None
    if not_storable(root, column_types):
        return None
    scales = _derived_scales(root, column_types, derived_columns)
    if scales is None:
        return None
    by_position = dict(zip(tree.columns, visible, strict=True))
    shown = {column: by_position[renames[column]] for column in renames}
    derived = tuple(Derived(by_position[d.column], d.expression) for d in derived_columns)
    state = aggregate_rule.state_node(root)
    taken = set(visible)
    names: list[tuple[str, str]] = []
    hidden: list[str] = []
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
            stored = _hidden_name("__pgt_s_", shown.get(owner, owner), taken)
            sums[owner] = stored
        elif column.startswith("__pgt_n_"):
            owner = column.removeprefix("__pgt_n_")
            stored = _hidden_name("__pgt_n_", shown.get(owner, owner), taken)
            counts[owner] = stored
        elif column in root.columns:  # an aggregate column only a derived column reads
            stored = _hidden_name("__pgt_v_", column, taken)
        else:  # pragma: no cover - state_node names every column one of the ways above
            raise ValueError(f"unexpected state column {column}")
        names.append((column, stored))
        hidden.append(stored)
    averages: list[Average] = []
    for name, call in root.aggregates:
        if isinstance(ir.split_aggregate(call)[0], exp.Avg) and name in shown:
            averages.append(Average(shown[name], sums[name], counts[name]))
    keys = tuple(shown[k] for k, _ in root.keys)
    stored_of = dict(names)
    sum_pairs = tuple(
        (stored_of[total], stored_of[count]) for total, count in aggregate_rule.sum_counts(root).items()
    )
    return StoredAggregate(
        root,
        state,
        tuple(names),
        keys,
        tuple(hidden),
        tuple(averages),
        sum_pairs,
        derived,
        tuple(sorted(scales.items())),
    )


def stored_rows(stored: StoredAggregate, state_rows: ir.Node) -> ir.Node:
    """Rows of the state (``state_rows`` has the state's columns) under their stored names."""
    return ir.Project(state_rows, tuple((s, exp.column(c)) for c, s in stored.names))
