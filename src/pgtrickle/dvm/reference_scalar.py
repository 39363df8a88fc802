"""Scalar expressions, aggregate calls and window functions of the reference evaluator.

Pure: values are Python ``None`` (SQL NULL), ``bool``, ``int``, ``decimal.Decimal`` and
``str``; a row is a mapping from column name to value. The semantics are PostgreSQL's:

- **Three-valued logic.** ``AND`` is false when either side is false, else NULL when either is
  NULL; ``OR`` dually; ``NOT NULL`` is NULL. Comparisons and arithmetic with a NULL operand are
  NULL. ``IS [NOT] DISTINCT FROM`` treats NULL as a value. ``x IN (list)`` is true on a match,
  else NULL when ``x`` or a list item is NULL, else false. A predicate keeps a row only when it
  is true (not NULL).
- **Arithmetic.** integer ``/`` truncates toward zero; a zero divisor raises
  :class:`EvaluationError` with SQLSTATE 22012 as PostgreSQL does. A non-integer literal is a
  ``Decimal`` (``numeric``).
- **Aggregates** (over the rows of a group, each row once per unit of net weight):
  ``COUNT(*)``, ``COUNT(x)`` (non-NULL ``x``), ``SUM``/``MIN``/``MAX`` (NULL over no non-NULL
  value), ``AVG`` (``numeric``: exact ``Decimal`` quotient), each with ``DISTINCT`` (over the
  distinct non-NULL values) and ``FILTER (WHERE …)`` (only rows where the condition is true).
- **Window functions**: ``ROW_NUMBER``, ``RANK``, ``DENSE_RANK`` and the aggregates above
  ``OVER (PARTITION BY … ORDER BY …)`` with the default frame (``RANGE UNBOUNDED PRECEDING``
  to the current row's last peer; the whole partition without ``ORDER BY``). Rows that tie on
  the ``ORDER BY`` keys are numbered in whole-row order (ascending, NULLs last), the same tie
  break ``TopK`` uses, so the result is a function of the input.

Anything else raises :class:`pgtrickle.errors.UnsupportedQueryError` naming the construct.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from sqlglot import exp

from pgtrickle.dvm.ir import split_aggregate
from pgtrickle.errors import PgTrickleError, UnsupportedQueryError

Row = Mapping[str, Any]


class EvaluationError(PgTrickleError):
    """An expression failed at run time as it would in PostgreSQL; ``sqlstate`` is its code."""

    def __init__(self, message: str, sqlstate: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def _unsupported(node: exp.Expr, what: str = "expression") -> UnsupportedQueryError:
    return UnsupportedQueryError(f"the reference evaluator does not support the {what} {node.sql()!r}")


# --- scalar expressions -------------------------------------------------------------------


def _and(values: Sequence[Any]) -> bool | None:
    if any(v is False for v in values):
        return False
    return None if any(v is None for v in values) else True


def _or(values: Sequence[Any]) -> bool | None:
    if any(v is True for v in values):
        return True
    return None if any(v is None for v in values) else False


def _divide(a: Any, b: Any) -> Any:
    if b == 0:
        raise EvaluationError("division by zero", "22012")
    if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool):
        quotient = abs(a) // abs(b)
        return quotient if (a >= 0) == (b >= 0) else -quotient
    return Decimal(a) / Decimal(b)


def _modulo(a: Any, b: Any) -> Any:
    if b == 0:
        raise EvaluationError("division by zero", "22012")
    return a - b * _divide(a, b) if isinstance(a, int) and isinstance(b, int) else Decimal(a) % Decimal(b)


_BINARY: dict[type[exp.Expr], Callable[[Any, Any], Any]] = {
    exp.EQ: lambda a, b: a == b,
    exp.NEQ: lambda a, b: a != b,
    exp.GT: lambda a, b: a > b,
    exp.GTE: lambda a, b: a >= b,
    exp.LT: lambda a, b: a < b,
    exp.LTE: lambda a, b: a <= b,
    exp.Add: lambda a, b: a + b,
    exp.Sub: lambda a, b: a - b,
    exp.Mul: lambda a, b: a * b,
    exp.Div: _divide,
    exp.Mod: _modulo,
}


def _literal(node: exp.Literal) -> Any:
    text = node.this
    if node.is_string:
        return text
    try:
        return int(text)
    except ValueError:
        return Decimal(text)


def _cast(value: Any, node: exp.Cast) -> Any:
    target = node.to
    if value is None:
        return None
    if target.is_type(*exp.DataType.INTEGER_TYPES):
        return int(Decimal(value).to_integral_value(rounding=ROUND_HALF_UP))
    if target.is_type(exp.DType.DECIMAL):
        return Decimal(value)
    if target.is_type(*exp.DataType.TEXT_TYPES):
        return str(value)
    if target.is_type(exp.DType.BOOLEAN) and isinstance(value, bool):
        return value
    raise _unsupported(node, "cast")


def scalar(node: exp.Expr, row: Row) -> Any:
    """The value of ``node`` on ``row`` (column name → value), with SQL NULL semantics."""
    if isinstance(node, exp.Paren):
        return scalar(node.this, row)
    if isinstance(node, exp.Column):
        if node.name not in row:
            raise UnsupportedQueryError(f"the column {node.name!r} is not among {sorted(row)}")
        return row[node.name]
    if isinstance(node, exp.Literal):
        return _literal(node)
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.And):
        return _and([scalar(node.this, row), scalar(node.expression, row)])
    if isinstance(node, exp.Or):
        return _or([scalar(node.this, row), scalar(node.expression, row)])
    if isinstance(node, exp.Not):
        value = scalar(node.this, row)
        return None if value is None else not value
    if isinstance(node, exp.Neg):
        value = scalar(node.this, row)
        return None if value is None else -value
    if isinstance(node, (exp.NullSafeEQ, exp.NullSafeNEQ)):
        same = scalar(node.this, row) == scalar(node.expression, row)
        return same if isinstance(node, exp.NullSafeEQ) else not same
    if isinstance(node, exp.Is):
        return _is(node, row)
    if type(node) in _BINARY:
        left, right = scalar(node.this, row), scalar(node.expression, row)
        return None if left is None or right is None else _BINARY[type(node)](left, right)
    if isinstance(node, exp.In) and node.expressions and not node.args.get("query"):
        value = scalar(node.this, row)
        items = [scalar(item, row) for item in node.expressions]
        if value is not None and any(item == value for item in items if item is not None):
            return True
        return None if value is None or any(item is None for item in items) else False
    if isinstance(node, exp.Coalesce):
        for item in [node.this, *node.expressions]:
            value = scalar(item, row)
            if value is not None:
                return value
        return None
    if isinstance(node, exp.Case):
        return _case(node, row)
    if isinstance(node, exp.Cast):
        return _cast(scalar(node.this, row), node)
    raise _unsupported(node)


def _is(node: exp.Is, row: Row) -> bool:
    value = scalar(node.this, row)
    target = node.expression
    if isinstance(target, exp.Null):
        result = value is None
    elif isinstance(target, exp.Boolean):
        result = value is bool(target.this)
    else:
        raise _unsupported(node)
    return not result if node.args.get("negate") else result


def _case(node: exp.Case, row: Row) -> Any:
    subject = node.this
    subject_value = scalar(subject, row) if subject is not None else None
    for branch in node.args.get("ifs") or []:
        condition = scalar(branch.this, row)
        if subject is not None:
            condition = None if condition is None or subject_value is None else condition == subject_value
        if condition is True:
            return scalar(branch.args["true"], row)
    default = node.args.get("default")
    return scalar(default, row) if default is not None else None


def holds(predicate: exp.Expr | None, row: Row) -> bool:
    """Whether ``predicate`` is true on ``row`` (NULL and false reject; ``None``: no predicate)."""
    return predicate is None or scalar(predicate, row) is True


# --- aggregates -------------------------------------------------------------------------------


def aggregate(node: exp.Expr, rows: Sequence[Row]) -> Any:
    """The value of the aggregate call ``node`` over ``rows`` (one entry per occurrence)."""
    call, argument, distinct, where = split_aggregate(node)
    kept = [row for row in rows if holds(where, row)]
    if argument is None:
        return len(kept)
    values = [v for v in (scalar(argument, row) for row in kept) if v is not None]
    if distinct:
        values = list(dict.fromkeys(values))
    if isinstance(call, exp.Count):
        return len(values)
    if not values:
        return None
    if isinstance(call, exp.Sum):
        return sum(values)
    if isinstance(call, exp.Avg):
        return Decimal(sum(values)) / Decimal(len(values))
    return min(values) if isinstance(call, exp.Min) else max(values)


# --- ordering and window functions --------------------------------------------------------------


def _compare_values(a: Any, b: Any, desc: bool, nulls_first: bool) -> int:
    if a is None or b is None:
        if a is None and b is None:
            return 0
        return (-1 if a is None else 1) * (1 if nulls_first else -1)
    result = (a > b) - (a < b)
    return -result if desc else result


def order_key(order: Sequence[exp.Ordered], columns: Sequence[str]) -> Callable[[tuple[Any, ...]], Any]:
    """A sort key for row tuples: ``order`` (PostgreSQL's NULL placement), then the whole row
    ascending with NULLs last, so that the order is total."""
    specs = []
    for item in order:
        desc = bool(item.args.get("desc"))
        nulls_first = item.args.get("nulls_first")
        specs.append((item.this, desc, desc if nulls_first is None else bool(nulls_first)))

    def compare(a: tuple[Any, ...], b: tuple[Any, ...]) -> int:
        row_a, row_b = dict(zip(columns, a, strict=True)), dict(zip(columns, b, strict=True))
        for expression, desc, nulls_first in specs:
            result = _compare_values(scalar(expression, row_a), scalar(expression, row_b), desc, nulls_first)
            if result:
                return result
        for x, y in zip(a, b, strict=True):
            result = _compare_values(x, y, False, False)
            if result:
                return result
        return 0

    return functools.cmp_to_key(compare)


def window_values(function: exp.Expr, rows: Sequence[tuple[Any, ...]], columns: Sequence[str]) -> list[Any]:
    """The value of the window function ``function`` for each of ``rows`` (a list of row tuples,
    one per occurrence), in the order of ``rows``."""
    if not isinstance(function, exp.Window) or function.args.get("spec") is not None:
        raise _unsupported(function, "window function")
    call = function.this
    ranking = isinstance(call, (exp.RowNumber, exp.Rank, exp.DenseRank))
    if not ranking:
        split_aggregate(call)
    partition_by = function.args.get("partition_by") or []
    order_node = function.args.get("order")
    order: list[exp.Ordered] = list(order_node.expressions) if order_node is not None else []
    partitions: dict[tuple[Any, ...], list[int]] = {}
    for index, row in enumerate(rows):
        named = dict(zip(columns, row, strict=True))
        partitions.setdefault(tuple(scalar(p, named) for p in partition_by), []).append(index)
    key = order_key(order, columns)
    out: list[Any] = [None] * len(rows)
    for members in partitions.values():
        members.sort(key=lambda i: key(rows[i]))
        peers = [
            tuple(scalar(o.this, dict(zip(columns, rows[i], strict=True))) for o in order) for i in members
        ]
        rank = dense = 0
        for position, index in enumerate(members):
            if position == 0 or peers[position] != peers[position - 1]:
                rank, dense = position + 1, dense + 1
            last_peer = position
            while last_peer + 1 < len(members) and peers[last_peer + 1] == peers[position]:
                last_peer += 1
            if isinstance(call, exp.RowNumber):
                out[index] = position + 1
            elif isinstance(call, exp.Rank):
                out[index] = rank
            elif isinstance(call, exp.DenseRank):
                out[index] = dense
            else:
                frame = members[: last_peer + 1] if order else members
                out[index] = aggregate(call, [dict(zip(columns, rows[i], strict=True)) for i in frame])
    return out
